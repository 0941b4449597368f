"""{{name}}: a leash plan that keeps a record store in step with the
records you want. Input: {"store": "http://host/records", "desired":
{"key": "value", ...}}; the store answers GET {store} with a JSON object of
its records and takes PUT and DELETE {store}/{key}.

The execute phase reads the store (reads are allowed), works out the change
and proposes one write per record: a person approves exactly those writes.
The apply phase sends the approved writes, each once; the host refuses
anything else."""

import leash


def execute(input):
    want = leash.json_input(input)
    store, desired = want.get("store"), want.get("desired")
    if not isinstance(store, str) or not isinstance(desired, dict):
        raise leash.InvalidInput('input must be {"store": "...", "desired": {...}}')
    current = leash.http.get(store).json()
    base = store.rstrip("/")
    changes = []
    for key, value in sorted(desired.items()):
        if current.get(key) != value:
            leash.plan.propose("PUT", f"{base}/{key}", body=str(value).encode())
            changes.append(f"put {key}")
    for key in sorted(k for k in current if k not in desired):
        leash.plan.propose("DELETE", f"{base}/{key}")
        changes.append(f"delete {key}")
    leash.info(f"proposed {len(changes)} writes")
    return {"changes": changes}


class WitWorld(leash.Plugin):
    def handle(self, ctx, input):
        if ctx.target == "execute":
            return execute(input)
        if ctx.target == "apply":
            # Exactly the approved writes, in order, each once.
            return {"applied": len(leash.plan.send_approved())}
        raise leash.InvalidInput(f"{{name}} has no action {ctx.target}")
