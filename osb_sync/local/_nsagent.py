"""Network namespace agent of a local sandbox; run as a script inside a fresh namespace.

Usage: `_nsagent.py SOCKET_PATH JUPYTER_PORT`. It brings the namespace's loopback up, accepts
and drops connections on 127.0.0.1:JUPYTER_PORT, relays each connection made to the Unix socket
SOCKET_PATH to the in-namespace port named on its first line (answer `ok\\n` or `error ...\\n`),
prints `ready`, and exits when its standard input reaches EOF (the server went away).
Standard library only, and importable for tests without side effects.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
import threading

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ_SIZE = 40
SOCKET_NAME = "agent.sock"


def loopback_up() -> None:
    """Bring `lo` up: a new network namespace starts with it down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0).ljust(IFREQ_SIZE, b"\0")
        flags = struct.unpack_from("16sH", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        request = struct.pack("16sH", b"lo", flags | IFF_UP).ljust(IFREQ_SIZE, b"\0")
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, request)


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy bytes from `source` to `target` until EOF, then half-close `target`."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(client: socket.socket) -> None:
    """Serve one relay request: read the port, connect, then copy both ways."""
    with client:
        line = b""
        while not line.endswith(b"\n") and len(line) < 16:
            byte = client.recv(1)
            if not byte:
                return
            line += byte
        try:
            upstream = socket.create_connection(("127.0.0.1", int(line)), timeout=10)
        except (OSError, ValueError) as exc:
            client.sendall(f"error {exc}\n".encode())
            return
        with upstream:
            upstream.settimeout(None)
            client.sendall(b"ok\n")
            back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
            back.start()
            pump(client, upstream)
            back.join()


def accept_forever(server: socket.socket, serve: bool) -> None:
    """Accept connections: relay them when `serve`, else drop them at once."""
    while True:
        conn, _ = server.accept()
        if serve:
            threading.Thread(target=relay, args=(conn,), daemon=True).start()
        else:
            conn.close()


def main(argv: list[str]) -> int:
    """Run the agent until standard input closes."""
    socket_path, jupyter_port = argv[1], int(argv[2])
    loopback_up()
    jupyter = socket.create_server(("127.0.0.1", jupyter_port))
    relay_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A socket path is limited to about 107 bytes: bind by name from inside its directory.
    os.chdir(os.path.dirname(socket_path))
    relay_server.bind(SOCKET_NAME)
    os.chmod(SOCKET_NAME, 0o600)
    relay_server.listen(128)
    for server, serve in ((jupyter, False), (relay_server, True)):
        threading.Thread(target=accept_forever, args=(server, serve), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.buffer.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
