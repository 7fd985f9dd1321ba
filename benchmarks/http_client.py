"""Cost of a bounded call (credo.http_client: whole-call deadline + reply cap) against plain urllib, R = B / A.

Both sides POST the same small JSON body to one local ThreadingHTTPServer on 127.0.0.1 and read the whole reply:
A is ``urllib.request.urlopen`` (per-read timeout, unbounded reply), B is ``credo.http_client.request_json`` (what
every credo client uses since issue 33). One sample is a batch of ``--calls`` calls; the batches alternate A B A B
(benchmarks/harness.py ``run_inprocess``), paired, and the result is the median per-pair ratio with a bootstrap 95%
interval, printed as ``bounded / urllib call: R x [lo, hi]`` (below 1: the bounded call is cheaper). ``--big`` does
the same with a ~4.2 MB reply. The raw series go to a JSON file (--json, default runs/bench/).

    python benchmarks/http_client.py                 # small replies, 20 pairs of 500 calls
    python benchmarks/http_client.py --big --calls 5 --repeats 10
"""
from __future__ import annotations

import argparse
import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import harness  # benchmarks/ (this script's directory) is on sys.path
from credo.http_client import request_json

SMALL = json.dumps({"observation": "x" * 200, "reward": 0.0, "done": False}).encode()
BIG = json.dumps({"scores": [0.123456789] * 350_000}).encode()  # ~4.2 MB


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = BIG if self.path == "/big" else SMALL
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def with_urllib(url: str) -> object:
    req = urllib.request.Request(url, data=b'{"action": "a"}', headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def with_bounded(url: str) -> object:
    return request_json(url, {"action": "a"}, deadline_s=30, max_reply_bytes=64 << 20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=500, help="calls per timed sample")
    p.add_argument("--repeats", type=int, default=20, help="timed pairs")
    p.add_argument("--warmup", type=int, default=2, help="pairs left out")
    p.add_argument("--big", action="store_true", help="a ~4.2 MB reply instead of a small one")
    p.add_argument("--json", default=None, help="raw series (default runs/bench/)")
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{'big' if args.big else 'small'}"
    assert with_urllib(url) == with_bounded(url)  # the same reply either way
    sides = {"A": with_urllib, "B": with_bounded}

    def batch(side: str) -> None:
        for _ in range(args.calls):
            sides[side](url)

    cmp = harness.run_inprocess(batch, repeats=args.repeats, warmup=args.warmup, labels=("urllib", "bounded"),
                                name=f"bounded / urllib call ({'4.2 MB' if args.big else 'small'} reply)")
    harness.report(cmp, args.json)
    server.shutdown()


if __name__ == "__main__":
    main()
