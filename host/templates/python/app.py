"""{{name}}: a leash plugin. Greets {"name": "..."} in {"steps": N} steps,
logging and reporting progress, and stops as soon as it is asked to."""

import leash


class WitWorld(leash.Plugin):
    def handle(self, ctx, input):
        args = leash.json_input(input, default={})
        name = args.get("name", "world")
        steps = int(args.get("steps", 3))
        if not isinstance(name, str) or not name.strip():
            raise leash.InvalidInput("name must be a non-blank string")
        for step in range(1, steps + 1):
            # True once the job is cancelled or its worker shuts down.
            if leash.progress(step, steps, "greeting") or leash.cancelled():
                raise leash.Failed(f"cancelled after {step - 1} of {steps} steps")
        leash.info(f"greeting {name} (attempt {ctx.attempt})")
        return {"greeting": f"Hello, {name}!"}
