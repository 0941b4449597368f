"""Runs the built component through `leash run` (the `leash` on PATH, or
the binary $LEASH names). Build it first: see README.md."""

import json
import unittest

from built import run


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
