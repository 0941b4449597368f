"""{{name}}: a leash plugin that fetches JSON. Input: {"url": "..."};
output: {"status": 200, "data": <the JSON it got>}. An upstream answering
5xx (or not answering) is a retryable error, so a durable job with attempts
left runs again; any other failure ends the job."""

import leash


class WitWorld(leash.Plugin):
    def handle(self, ctx, input):
        url = leash.json_input(input).get("url")
        if not isinstance(url, str):
            raise leash.InvalidInput('input must be {"url": "..."}')
        leash.info(f"fetching {url} (attempt {ctx.attempt})")
        # True once the job is cancelled or its worker shuts down.
        if leash.progress(0, 1, "fetching"):
            raise leash.Failed("cancelled before fetching")
        # No response at all raises leash.HttpError, which fails the job
        # (as Retryable when a later try may succeed).
        response = leash.http.get(url, headers={"accept": "application/json"}, timeout=10)
        if response.status >= 500:
            raise leash.Retryable(f"{url} answered {response.status}")
        if not response.ok:
            raise leash.Failed(f"{url} answered {response.status}: {response.text()[:200]}")
        data = response.json()
        leash.progress(1, 1, "fetched")
        leash.info(f"{url} answered {response.status}")
        return {"status": response.status, "data": data}
