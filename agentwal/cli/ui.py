"""``agentwal ui``: serve the read-only web viewer of a store on this machine."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
import threading
import webbrowser

import click

from .app import main
from .common import examples, open_ro, reports_errors, store_argument, usage

LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@main.command(epilog=examples("agentwal ui state.awal",
                              "agentwal ui state.awal --port 9000 --open",
                              "agentwal ui state.awal --host 0.0.0.0"))
@store_argument
@click.option("--host", default="127.0.0.1", show_default=True, envvar="AGENTWAL_UI_HOST",
              help="Address to listen on. Anything but loopback must be given here "
                   "explicitly (the viewer has no login).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@reports_errors
def ui(path: str, host: str, port: int, open_browser: bool) -> None:
    """Browse a store in a web page: runs, checkpoint trees, state, diffs, effects, outbox.

    Opens the store read-only, so it runs beside a live agent and follows its
    commits as they land; it never writes. Listens on 127.0.0.1 unless
    --host says otherwise (a non-loopback address from AGENTWAL_UI_HOST alone
    is refused). Prints the address on stderr; Ctrl-C stops it. The JSON API
    under /api/ is described in docs/ui.md. Needs the ui extra:
    pip install 'agentwal[ui]'.
    """
    ctx = click.get_current_context()
    explicit = ctx.get_parameter_source("host") is click.core.ParameterSource.COMMANDLINE
    if not is_loopback(host) and not explicit:
        raise usage(f"refusing to listen on {host!r}, which is not a loopback address, "
                    "unless it is given with --host on the command line.")
    try:
        import uvicorn

        from ..ui import create_app
    except ImportError as exc:
        raise usage(f"agentwal ui needs the ui extra ({exc.name} is missing): "
                    "pip install 'agentwal[ui]'") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise usage(f"cannot listen on {host}:{port}: {exc.strerror}. Choose another "
                    "--port (0 picks a free one).") from None
    sock.listen(128)  # so a client that reads the address below can connect at once
    bound = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}/"
    with open_ro(path) as store:
        server = uvicorn.Server(uvicorn.Config(create_app(store, path), log_level="warning",
                                               lifespan="off"))
        click.echo(f"agentwal ui: {path} (read-only) at {url}", err=True)
        if not is_loopback(host):
            click.echo("warning: listening beyond this machine; anyone who can reach it can "
                       "read the store.", err=True)
        sys.stderr.flush()
        if open_browser:  # the socket already listens, so the browser's request waits for us
            threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how one stops it
            server.run(sockets=[sock])
        click.echo("agentwal ui: stopped", err=True)
