"""Runs both phases of the built component through `leash run` (the `leash`
on PATH, or the binary $LEASH names) against a record store on 127.0.0.1:
execute proposes, apply sends exactly what was proposed. Build it first: see
README.md."""

import json
import os
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from built import run

WRITES = []


class Store(BaseHTTPRequestHandler):
    def do_GET(self):
        self.answer(200, b'{"a":"1","c":"3"}')

    def do_PUT(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
        WRITES.append(f"PUT {self.path} {body}".strip())
        self.answer(204, b"")

    def do_DELETE(self):
        WRITES.append(f"DELETE {self.path}")
        self.answer(204, b"")

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class PluginTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ThreadingHTTPServer(("127.0.0.1", 0), Store)
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{cls.server.server_address[1]}"
        cls.url = f"{base}/records"
        cls.grant = ["--allow-host", f"GET,PUT,DELETE {base}"]
        cls.input = json.dumps({"store": cls.url, "desired": {"a": "1", "b": "2"}})

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()

    def setUp(self):
        WRITES.clear()

    def test_execute_proposes_the_writes_and_sends_none(self):
        report = run(self.input, ["--plan", "--phase", "execute", *self.grant])
        self.assertEqual(report["status"], "succeeded", report)
        proposed = [f"{p['method']} {p['url']}" for p in report["proposals"]]
        self.assertEqual(proposed, [f"PUT {self.url}/b", f"DELETE {self.url}/c"])
        self.assertEqual(WRITES, [], "execute wrote nothing")

    def test_apply_sends_exactly_the_approved_writes(self):
        report = run(self.input, ["--plan", "--phase", "execute", *self.grant])
        with tempfile.TemporaryDirectory() as tmp:
            approved = os.path.join(tmp, "approved.json")
            with open(approved, "w") as f:
                json.dump(report, f)
            report = run("", ["--phase", "apply", "--approved", approved, *self.grant])
        self.assertEqual(report["status"], "succeeded", report)
        self.assertEqual(WRITES, ["PUT /records/b 2", "DELETE /records/c"])


if __name__ == "__main__":
    unittest.main()
