"""One request through leash.http, as plugins/fetch (Rust) and
plugins/js/fetch make it: the same input, the same output, the same
errors. See plugins/fetch/src/lib.rs."""

import leash


class WitWorld(leash.Plugin):
    def handle(self, ctx, input):
        args = leash.json_input(input)
        url, method, headers = args["url"], args.get("method"), args.get("headers", {})
        timeout = args["timeout_ms"] / 1000 if "timeout_ms" in args else None
        if "json" in args and method is None and not headers and timeout is None:
            response = leash.http.post_json(url, args["json"])
        elif "json" not in args and method is None and not headers and timeout is None:
            response = leash.http.get(url)
        else:
            body = None
            if "json" in args:
                headers = {"content-type": "application/json", **headers}
                body = leash.json_output(args["json"])
            response = leash.http.request(method or ("POST" if "json" in args else "GET"), url, headers, body, timeout)
        return {"status": response.status, "content_type": response.header("content-type"), "text": response.text()}
