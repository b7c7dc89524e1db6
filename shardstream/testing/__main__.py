"""``python -m shardstream.testing``: start a local S3 server, create buckets, print its environment."""

import sys

from .s3server import main

sys.exit(main())
