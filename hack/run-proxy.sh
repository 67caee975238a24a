#!/usr/bin/env bash
# Runs the proxy standalone in front of the fake backend: the fake on 127.0.0.1:8000,
# the proxy on 127.0.0.1:8080 (admin on :9090) with config/samples/proxy.yaml, which
# is reloaded when you edit it. Ctrl-C stops both.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
config=${PROXY_CONFIG:-config/samples/proxy.yaml}

go build -o bin/proxy ./proxy/cmd/proxy
go build -o bin/fakellm ./test/fakellm/cmd/fakellm
bin/proxy validate "$config"

bin/fakellm --listen 127.0.0.1:8000 --input-tokens 1200 --output-tokens 300 &
fake=$!
trap 'kill $fake 2>/dev/null || true' EXIT

cat <<MSG

The proxy is starting on http://127.0.0.1:8080 in front of a fake backend.
Try, in another terminal:

  curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Authorization: Bearer sk-demo-alice' \\
    -H 'Content-Type: application/json' -d '{"model":"demo","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}' -i

  # sk-demo-batch has 3500 tokens a minute and each call uses 1500: the third is refused with 429.
  for i in 1 2 3; do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:8080/v1/chat/completions \\
    -H 'Authorization: Bearer sk-demo-batch' -d '{"model":"demo","max_tokens":1000}'; done

  curl -s http://127.0.0.1:9090/admin/effective      # the limits in force
  curl -s http://127.0.0.1:9090/metrics | grep rate_limit_token_budget

Edit $config and the proxy reloads it. Ctrl-C stops both.

MSG
bin/proxy --config "$config"
