"""Parse an OpenMetrics exposition (stdin) with the Prometheus project's own Python
parser (prometheus_client.openmetrics.parser, strict) and print its samples as JSON:
[[name, labels, value], ...]. A text the parser refuses exits non-zero with its error."""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append([s.name, s.labels, s.value])
print(json.dumps(out))
