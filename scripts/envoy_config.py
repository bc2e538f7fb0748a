#!/usr/bin/env python3
"""Renders deploy/envoy/envoy.yaml for a standalone Envoy in front of engines.

  scripts/envoy_config.py --listen 127.0.0.1:10000 --epp 127.0.0.1:9002 \
      --admin-port 9901 --endpoints 10.0.0.7:8000,10.0.0.8:8000 > envoy.yaml
  envoy -c envoy.yaml

--fail-open sends requests round robin to the endpoints while the picker is
down (default: 503). --no-epp leaves the picker out (every request round
robin: the static route the picker's cost is measured against).
"""
import argparse
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--listen", default="0.0.0.0:10000")
p.add_argument("--epp", default="127.0.0.1:9002")
p.add_argument("--admin-port", type=int, default=9901)
p.add_argument("--endpoints", required=True, help="the engines' host:port, comma-separated")
p.add_argument("--fail-open", action="store_true")
p.add_argument("--no-epp", action="store_true")
p.add_argument("--template", default=str(root / "deploy/envoy/envoy.yaml"),
               help="the configuration to fill in (default: deploy/envoy/envoy.yaml)")
a = p.parse_args()

text = pathlib.Path(a.template).read_text()
listen_host, listen_port = a.listen.rsplit(":", 1)
epp_host, epp_port = a.epp.rsplit(":", 1)
fallback = "".join(
    f"        - endpoint: {{ address: {{ socket_address: {{ address: {h}, port_value: {port} }} }} }}\n"
    for h, port in (e.rsplit(":", 1) for e in a.endpoints.split(",") if e)
)
for k, v in {
    "${LISTEN_HOST}": listen_host, "${LISTEN_PORT}": listen_port, "${ADMIN_PORT}": str(a.admin_port),
    "${EPP_HOST}": epp_host, "${EPP_PORT}": epp_port, "${FAIL_OPEN}": "true" if a.fail_open else "false",
}.items():
    text = text.replace(k, v)
text = text.replace("${FALLBACK}\n", fallback)
if a.no_epp:
    text = re.sub(r"          # The decision:.*?(?=          - name: envoy\.filters\.http\.router)", "", text, flags=re.S)
sys.stdout.write(text)
