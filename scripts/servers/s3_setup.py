"""Prepares a moto S3 server for the transport tests (uses boto3, independent of our S3 client).

Creates a bucket and uploads every fixture under `fixtures/`. With --auth it first creates an IAM
user with an access key allowed to do anything on S3, then turns moto's request authentication on
(from then on every request must be signed with that key). Prints shell `export` lines.
"""

import argparse
import json
import os
import urllib.request

import boto3
from botocore.config import Config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--auth", action="store_true")
    ap.add_argument("--prefix", default="TZ_TEST_S3")
    args = ap.parse_args()

    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3})
    out = {}
    if args.auth:
        iam = session.client("iam", endpoint_url=args.endpoint)
        iam.create_user(UserName="tz-test")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*", "iam:*"], "Resource": "*"}],
        }
        iam.put_user_policy(UserName="tz-test", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="tz-test")["AccessKey"]
        out["ACCESS_KEY"] = key["AccessKeyId"]
        out["SECRET_KEY"] = key["SecretAccessKey"]
        session = boto3.session.Session(
            aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
            region_name="us-east-1",
        )
    else:
        out["ACCESS_KEY"] = "testing"
        out["SECRET_KEY"] = "testing"
    s3 = session.client("s3", endpoint_url=args.endpoint, config=cfg)
    s3.create_bucket(Bucket=args.bucket)
    if not args.auth:
        # Anyone may read: the anonymous-access tests need it.
        public = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": "*",
                    "Action": "s3:GetObject",
                    "Resource": f"arn:aws:s3:::{args.bucket}/*",
                }
            ],
        }
        s3.put_bucket_policy(Bucket=args.bucket, Policy=json.dumps(public))
    for name in sorted(os.listdir(args.fixtures)):
        path = os.path.join(args.fixtures, name)
        if os.path.isfile(path):
            s3.upload_file(path, args.bucket, "fixtures/" + name)
    if args.auth:
        # From now on moto checks every request's signature and the key's policies.
        req = urllib.request.Request(
            args.endpoint + "/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(req, timeout=10).read()
    out["ENDPOINT"] = args.endpoint
    out["BUCKET"] = args.bucket
    for k, v in out.items():
        print(f"export {args.prefix}_{k}={v}")


if __name__ == "__main__":
    main()
