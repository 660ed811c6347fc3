#!/usr/bin/env python3
"""A TCP proxy that can go silent, for the partition fault of tests/faults.

    proxy.py LISTEN_HOST LISTEN_PORT TARGET_FILE

Forwards every connection accepted on LISTEN_HOST:LISTEN_PORT to the
"host port" written in TARGET_FILE (read at each new connection, so it
follows a failover). SIGUSR1 starts a partition: the proxy stops moving
bytes in both directions but closes nothing, so neither side learns anything
from it. SIGUSR2 heals it: buffered bytes flow again. A side that closes or
resets is passed on by closing the other side.

tests/faults/cluster.py runs it in a network namespace of its own, reached over
a veth pair, and takes the link down during the partition, so the kernels on
either side see no packet either: no keepalive answer, no acknowledgement.
"""
import select
import signal
import socket
import sys
import threading

LISTEN_HOST, LISTEN_PORT, TARGET_FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
flowing = threading.Event()
flowing.set()
signal.signal(signal.SIGUSR1, lambda *_: flowing.clear())
signal.signal(signal.SIGUSR2, lambda *_: flowing.set())


def pipe(a, b):
    """Copy a <-> b until either side closes, holding everything while partitioned."""
    try:
        while True:
            flowing.wait()
            ready, _, _ = select.select([a, b], [], [], 0.1)
            if not flowing.is_set():
                continue  # partitioned meanwhile: leave the bytes in the kernel's buffers
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                (b if src is a else a).sendall(data)
    except OSError:
        return
    finally:
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass


def main():
    srv = socket.create_server((LISTEN_HOST, LISTEN_PORT))
    print("listening", flush=True)
    while True:
        client, _ = srv.accept()
        host, port = open(TARGET_FILE, encoding="utf-8").read().split()
        try:
            upstream = socket.create_connection((host, int(port)), timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()


if __name__ == "__main__":
    main()
