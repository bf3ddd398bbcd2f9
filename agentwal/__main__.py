"""``python -m agentwal``: the same command as the ``agentwal`` console script."""

from agentwal.cli import main

if __name__ == "__main__":
    main(prog_name="agentwal")
