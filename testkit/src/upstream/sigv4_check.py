# The fake Bedrock's check of a request's SigV4 signature, recomputed by botocore (AWS's
# Python SDK): the request on stdin as JSON; exit 0 if it is signed by the expected
# credential for `bedrock` in the expected region, else 1 with why on stderr.
import base64, datetime, hmac, json, sys

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def fail(why):
    print("fake bedrock: signature refused: " + why, file=sys.stderr)
    sys.exit(1)


r = json.load(sys.stdin)
key_id, secret, token = r["credential"].split(":")
headers = {}
for name, value in r["headers"]:
    if name in headers:
        fail("header %s sent twice" % name)
    headers[name] = value
auth = headers.get("authorization", "")
prefix = "AWS4-HMAC-SHA256 "
if not auth.startswith(prefix):
    fail("no AWS4-HMAC-SHA256 authorization")
fields = dict(p.strip().split("=", 1) for p in auth[len(prefix):].split(","))
scope = fields.get("Credential", "").split("/")
if len(scope) != 5 or scope[0] != key_id or scope[2] != r["region"] or scope[3] != "bedrock" or scope[4] != "aws4_request":
    fail("credential scope %r" % scope)
signed = fields.get("SignedHeaders", "").split(";")
for needed in ["host", "x-amz-date", "content-type", "x-amz-security-token"]:
    if needed not in signed:
        fail("%s is not signed" % needed)
if headers.get("x-amz-security-token") != token:
    fail("not the session token")
stamp = headers["x-amz-date"]
when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
if abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) > 900:
    fail("x-amz-date %s is not within 15 minutes" % stamp)
if scope[1] != stamp[:8]:
    fail("the scope's date is not x-amz-date's")
request = AWSRequest(
    method=r["method"],
    url=r["url"],
    data=base64.b64decode(r["body"]),
    headers={name: headers[name] for name in signed},
)
request.context["timestamp"] = stamp
signer = SigV4Auth(Credentials(key_id, secret, token), "bedrock", r["region"])
canonical = signer.canonical_request(request)
want = signer.signature(signer.string_to_sign(request, canonical), request)
if not hmac.compare_digest(want, fields.get("Signature", "")):
    fail("the signature is not botocore's (canonical request:\n%s)" % canonical)
