"""Prints N distinct free loopback TCP ports (default 1), space-separated.

The ports are taken from 20000..32000, below Linux' default ephemeral range
(32768..60999): a port picked by binding port 0 comes from that range, and
between this script closing it and a server binding it, any outgoing
connection on the machine (a load tool's, a member's to its peers) may get
it as its source port; the server then fails with "Address already in use"
and a benchmark runs against one member fewer. The test harness picks its
ports the same way (tests/it/harness.rs, free_port).

Usage: python3 bench/free_ports.py [N]
"""

import random
import socket
import sys

LOW, SPAN = 20000, 12000


def free_ports(n):
    held, ports = [], []
    start = random.randrange(SPAN)
    for i in range(SPAN):
        port = LOW + (start + i) % SPAN
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        # Held until all are picked, so the N ports differ.
        held.append(s)
        ports.append(port)
        if len(ports) == n:
            break
    for s in held:
        s.close()
    if len(ports) < n:
        sys.exit(f"free_ports.py: only {len(ports)} free ports in {LOW}..{LOW + SPAN}")
    return ports


if __name__ == "__main__":
    print(" ".join(str(p) for p in free_ports(int(sys.argv[1]) if len(sys.argv) > 1 else 1)))
