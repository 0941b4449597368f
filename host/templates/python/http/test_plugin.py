"""Runs the built component through `leash run` (the `leash` on PATH, or
the binary $LEASH names) against an upstream on 127.0.0.1. Build it first:
see README.md."""

import json
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from built import run


class Upstream(BaseHTTPRequestHandler):
    def do_GET(self):
        status, body = (200, b'{"id":1,"title":"write a plugin"}') if self.path == "/todo" else (503, b'{"error":"down"}')
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class PluginTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()
        cls.base = f"http://127.0.0.1:{cls.server.server_address[1]}"
        cls.grant = ["--allow-host", f"GET {cls.base}"]

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()

    def test_fetches_json_from_a_granted_upstream(self):
        report = run(json.dumps({"url": f"{self.base}/todo"}), self.grant)
        self.assertEqual(report["status"], "succeeded", report)
        self.assertEqual(json.loads(report["output"])["data"]["title"], "write a plugin")

    def test_a_5xx_is_retryable(self):
        report = run(json.dumps({"url": f"{self.base}/down"}), self.grant)
        self.assertTrue(report["retryable"], report)
        self.assertIn("503", report["message"])

    def test_an_ungranted_host_is_refused(self):
        report = run(json.dumps({"url": f"{self.base}/todo"}))
        self.assertEqual(report["status"], "failed", report)
        self.assertIn("HTTP-request-denied", report["message"])


if __name__ == "__main__":
    unittest.main()
