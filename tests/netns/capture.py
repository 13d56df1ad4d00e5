"""Keeps every frame that crosses one interface, both ways (an AF_PACKET socket; root), as
length-prefixed records in a file, until SIGTERM: tests/netns/test_tier2_curve.py reads what
crossed a node's link.

    capture.py IFNAME OUT
"""
import signal
import socket
import struct
import sys


def main():
    ifname, out = sys.argv[1:3]
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    s.bind((ifname, 0))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    s.settimeout(0.1)
    with open(out, "wb") as f:
        print("capturing", flush=True)
        while not stop:
            try:
                frame = s.recv(1 << 18)  # a veth hands over GSO frames of up to 64 KiB
            except socket.timeout:
                continue
            except InterruptedError:
                continue
            f.write(struct.pack("<I", len(frame)) + frame)


if __name__ == "__main__":
    main()
