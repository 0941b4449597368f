"""The friendly example: greets a name, logs, and reports progress.

Input (optional JSON): {"name": "Ada"}. Output: {"greeting": "Hello, Ada!", "target", "attempt"}.
"""

import leash


class WitWorld(leash.Plugin):
    def handle(self, ctx, input):
        name = leash.json_input(input, default={}).get("name", "world")
        if not isinstance(name, str) or not name.strip():
            raise leash.InvalidInput("name must be a non-blank string")
        leash.info(f"greeting {name}", language="python")
        leash.progress(1, 1, "greeted")
        return {"greeting": f"Hello, {name}!", "target": ctx.target, "attempt": ctx.attempt}
