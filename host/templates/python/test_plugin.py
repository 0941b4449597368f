"""Runs the built component through `leash run` (the `leash` on PATH, or
the binary $LEASH names). Build it first: see README.md."""

import json
import os
import subprocess
import unittest

WASM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "{{name}}.wasm")
LEASH = os.environ.get("LEASH", "leash")


def run(input):
    if not os.path.isfile(WASM):
        raise AssertionError(f"{WASM} is not built yet: see README.md")
    done = subprocess.run([LEASH, "run", "--json", "--input", "-", WASM], input=input.encode(), capture_output=True)
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"leash run printed no report: {done.stderr.decode()}") from None


class PluginTest(unittest.TestCase):
    def test_greets_the_name_it_is_given_and_logs_it(self):
        report = run('{"name": "Ada"}')
        self.assertEqual(report["status"], "succeeded", report)
        self.assertEqual(json.loads(report["output"])["greeting"], "Hello, Ada!")
        self.assertTrue(any("Ada" in r["message"] for r in report["logs"]), report["logs"])

    def test_a_blank_name_is_invalid_input(self):
        self.assertEqual(run('{"name": " "}')["error_kind"], "invalid_input")


if __name__ == "__main__":
    unittest.main()
