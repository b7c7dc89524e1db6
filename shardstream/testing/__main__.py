"""``python -m shardstream.testing``: start a local S3 server and print its environment."""

from .s3server import main

main()
