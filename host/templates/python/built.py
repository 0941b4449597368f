"""Runs the built component through `leash run` (the `leash` on PATH, or
the binary $LEASH names), refusing one that is missing or older than what
it is built from (an edit without a rebuild would test the old code)."""

import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
WASM = os.path.join(HERE, "{{name}}.wasm")
BUILD = """{{build}}"""
LEASH = os.environ.get("LEASH", "leash")


def wasm():
    if not os.path.isfile(WASM):
        raise AssertionError(f"{WASM} is not built yet: run `{BUILD}`")
    built = os.path.getmtime(WASM)
    # What componentize-py reads: the plugin's modules and the WIT.
    sources = [os.path.join(HERE, f) for f in os.listdir(HERE) if f.endswith(".py") and f != "built.py" and not f.startswith("test")]
    for root, _, files in os.walk(os.path.join(HERE, "wit")):
        sources += [os.path.join(root, f) for f in files]
    for source in sources:
        if os.path.getmtime(source) > built:
            raise AssertionError(f"{WASM} is older than {source}: rebuild it with `{BUILD}` (the test runs what was built)")
    return WASM


def run(input, flags=()):
    """`leash run --json` on the component with this input; the report."""
    done = subprocess.run([LEASH, "run", "--json", *flags, "--input", "-", wasm()], input=input.encode(), capture_output=True)
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"leash run printed no report: {done.stderr.decode()}") from None
