"""fault_server.py: a small HTTP/1.1 server with faults, for tests/remote (stdlib only).

    python3 fault_server.py ROOT PORT_FILE LOG_FILE

Serves the files under ROOT with Range support and keep-alive, on a free loopback port that
it writes to PORT_FILE once it listens (the test waits for that file, then for the port).
Each request is logged to LOG_FILE as "METHOD PATH RANGE STATUS". The first path segment
picks the fault; the rest names the file:

    /ok/F           served as asked
    /flaky/F        500 to the first request for F, then served
    /busy/F         429 to the first request for F, then served
    /cut/F          the first request for F gets its headers and half its body, then the
                    connection is closed; later requests are served
    /slow/F         headers sent, then no body byte until the client goes away
    /stallonce/F    the first request for F stalls as /slow/ does after half its body; later
                    requests are served
    /missing/F      404
    /forbidden/F    403 with an S3-style XML body <Code>AccessDenied</Code>
    /signed/F       403 unless the request carries "X-Test-Sign: ok"
    /norange/F      the whole file with 200, ignoring Range
"""
import http.server
import os
import re
import socketserver
import sys
import threading
import time

ROOT, PORT_FILE, LOG_FILE = sys.argv[1], sys.argv[2], sys.argv[3]
seen = set()
lock = threading.Lock()


def first_time(key):
    with lock:
        if key in seen:
            return False
        seen.add(key)
        return True


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def log(self, status):
        with lock, open(LOG_FILE, "a") as f:
            f.write("%s %s %s %d\n" % (self.command, self.path, self.headers.get("Range", "-"), status))

    def plain(self, status, body=b""):
        self.log(status)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        parts = self.path.split("?", 1)[0].split("/", 2)
        if len(parts) < 3:
            return self.plain(404)
        mode, name = parts[1], parts[2]
        key = mode + "/" + name
        if mode == "missing":
            return self.plain(404, b"<Error><Code>NoSuchKey</Code></Error>")
        if mode == "forbidden":
            return self.plain(403, b"<Error><Code>AccessDenied</Code><Message>x</Message></Error>")
        if mode == "signed" and self.headers.get("X-Test-Sign") != "ok":
            return self.plain(403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>")
        if mode == "flaky" and first_time(key):
            return self.plain(500, b"<Error><Code>InternalError</Code></Error>")
        if mode == "busy" and first_time(key):
            return self.plain(429, b"<Error><Code>SlowDown</Code></Error>")
        path = os.path.join(ROOT, name)
        try:
            data = open(path, "rb").read()
        except OSError:
            return self.plain(404)
        size = len(data)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m and mode != "norange":
            a = int(m.group(1))
            b = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if a >= size:
                self.log(416)
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status, body = 206, data[a : b + 1]
        else:
            status, body = 200, data
        self.log(status)
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, size))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if mode == "cut" and first_time(key):
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        stall = mode == "slow" or (mode == "stallonce" and first_time(key))
        if stall and mode == "stallonce":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
        if stall:
            while True:  # until the client closes: the write below then fails
                time.sleep(0.05)
                try:
                    self.wfile.write(b"")
                    self.wfile.flush()
                    if self.connection.recv(1, 0x40) == b"":  # MSG_DONTWAIT: peer gone
                        return
                except BlockingIOError:
                    continue
                except OSError:
                    return
        self.wfile.write(body)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


server = Server(("127.0.0.1", 0), Handler)
tmp = PORT_FILE + ".tmp"
with open(tmp, "w") as f:
    f.write(str(server.server_address[1]))
os.rename(tmp, PORT_FILE)
server.serve_forever()
