"""examples/langgraph_payment.py runs to the end and charges the card once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_payment.py"


def test_payment_example_charges_once_across_the_interrupt(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checkout ran 2 times; payment API: 1 request, 1 charge" in done.stdout
    assert "charged once across the interrupt" in done.stdout
    assert (tmp_path / "shop.awal").is_dir()
