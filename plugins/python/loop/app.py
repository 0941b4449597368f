"""A CPU loop, to show that every limit holds for Python guests.

Input (optional JSON):
  {"iterations": N}   stop after N iterations (default: never)
  {"cooperative": true}  report progress every 1,000 iterations and return
                         as soon as the host says stop
  {"grow_kib": K}     keep K KiB more memory alive every iteration
  {"crash": true}     raise an exception the plugin does not expect
Output on completion: {"iterations": N, "checksum": C}. Told to stop while
cooperative, it fails with "stopped after N iterations".
"""

import leash


class WitWorld(leash.Plugin):
    def handle(self, ctx, input):
        args = leash.json_input(input, default={})
        if args.get("crash"):
            raise ValueError("a crash the input asked for")
        limit = args.get("iterations")
        cooperative = bool(args.get("cooperative", False))
        grow = int(args.get("grow_kib", 0)) * 1024
        kept = []
        acc = 0
        i = 0
        while limit is None or i < limit:
            acc = (acc * 31 + i) % 1_000_000_007
            if grow:
                kept.append(bytearray(grow))
            i += 1
            if cooperative and i % 1000 == 0:
                if leash.progress(i, limit or 0, "looping") or leash.cancelled():
                    leash.info(f"stopping cleanly after {i} iterations")
                    raise leash.Failed(f"stopped after {i} iterations")
        return {"iterations": i, "checksum": acc}
