"""Returns its input bytes unchanged."""

import leash


class WitWorld(leash.Plugin):
    def handle(self, ctx, input):
        return bytes(input)
