"""``shardstream plan``: a training job's loading speed, egress, requests and cost, predicted from the index."""

from __future__ import annotations

import argparse

from .options import DATASET_HELP, add_s3_args, plan_size, positive_int, positive_number, s3_config, seconds


def add_parsers(commands) -> None:
    """Add ``plan``."""
    pl = commands.add_parser(
        "plan",
        help="predict a training job's loading speed, egress, requests and cost from the dataset's index",
    )
    pl.add_argument("dataset", metavar="DATASET", help=DATASET_HELP)
    pl.add_argument("--nodes", type=positive_int, default=1, metavar="N", help="nodes (default: 1)")
    pl.add_argument("--gpus-per-node", type=positive_int, default=1, metavar="G", help="ranks per node (default: 1)")
    pl.add_argument("--workers", type=int, default=2, metavar="W", help="DataLoader workers per rank (default: 2)")
    pl.add_argument("--batch-size", type=positive_int, default=64, metavar="B", help="batch size (default: 64)")
    pace = pl.add_mutually_exclusive_group()
    pace.add_argument("--step-time-s", type=seconds, metavar="S", help="seconds per training step (the pace)")
    pace.add_argument(
        "--samples-per-s-per-gpu", type=positive_number, metavar="R", help="samples/s each GPU consumes (the pace)"
    )
    pl.add_argument(
        "--cache-bytes", type=plan_size, default=0, metavar="SIZE", help="node cache per node, e.g. 200G (default: 0)"
    )
    pl.add_argument("--no-shuffle", action="store_true", help="shuffle=False")
    pl.add_argument("--seed", type=int, default=0, help="shuffle seed (default: 0)")
    pl.add_argument("--shuffle-buffer", type=int, default=1000, metavar="N", help="samples (default: 1000)")
    pl.add_argument("--max-open-shards", type=positive_int, default=4, metavar="N", help="lanes (default: 4)")
    pl.add_argument("--drop-last", action="store_true", help="drop_last=True")
    pl.add_argument("--shard-affinity", choices=["node"], help="node: each node keeps its share of the shards")
    pl.add_argument("--epochs", type=positive_int, default=2, metavar="E", help="epochs to plan (default: 2)")
    pl.add_argument("--latency-ms", type=positive_number, metavar="MS", help="first-byte time of a GET")
    pl.add_argument(
        "--bandwidth-per-node", type=plan_size, metavar="BYTES/S", help="a node's read bandwidth, e.g. 1.25G"
    )
    pl.add_argument("--bandwidth-per-stream", type=plan_size, metavar="BYTES/S", help="one connection's, e.g. 100M")
    pl.add_argument(
        "--request-rate-limit", type=positive_number, metavar="GETS/S", help="GETs/s the store serves the whole job"
    )
    pl.add_argument("--price-per-gb", type=float, metavar="USD", help="egress price per GB")
    pl.add_argument("--price-per-1000-gets", type=float, metavar="USD", help="price per 1,000 GETs")
    pl.add_argument("--cpu-s-per-sample", type=seconds, metavar="S", help="reader CPU seconds per sample")
    pl.add_argument(
        "--cpu-s-per-sample-cached", type=seconds, metavar="S", help="the same, for samples read from the node cache"
    )
    pl.add_argument("--open-s", type=seconds, metavar="S", help="seconds to open the dataset (index, client)")
    pl.add_argument("--client-s", type=seconds, metavar="S", help="seconds a new store client takes to its first GET")
    pl.add_argument("--worker-start-s", type=seconds, metavar="S", help="seconds to start a DataLoader worker")
    pl.add_argument("--cores-per-node", type=int, metavar="N", help="CPU cores per node (default: one per worker)")
    pl.add_argument("--persistent-workers", action="store_true", help="the DataLoader's persistent_workers=True")
    pl.add_argument(
        "--probe", action="store_true", help="measure latency, bandwidth and CPU from here against the store"
    )
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--plot", metavar="FILE.png", help="also draw the plan into this PNG (needs matplotlib)")
    add_s3_args(pl)
    pl.set_defaults(run=run)


def run(args: argparse.Namespace) -> int | None:
    """``shardstream plan``: the plan as a table (``--json``: JSON), and ``--plot`` drawn."""
    from ..planner import plan, plot

    job = plan(
        args.dataset,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        workers=args.workers,
        batch_size=args.batch_size,
        step_time_s=args.step_time_s,
        samples_per_s_per_gpu=args.samples_per_s_per_gpu,
        cache_bytes=args.cache_bytes,
        shuffle=not args.no_shuffle,
        seed=args.seed,
        shuffle_buffer=args.shuffle_buffer,
        max_open_shards=args.max_open_shards,
        drop_last=args.drop_last,
        shard_affinity=args.shard_affinity,
        epochs=args.epochs,
        latency_ms=args.latency_ms,
        bandwidth_per_node=args.bandwidth_per_node,
        bandwidth_per_stream=args.bandwidth_per_stream,
        request_rate_limit=args.request_rate_limit,
        price_per_gb=args.price_per_gb,
        price_per_1000_gets=args.price_per_1000_gets,
        cpu_s_per_sample=args.cpu_s_per_sample,
        cpu_s_per_sample_cached=args.cpu_s_per_sample_cached,
        open_s=args.open_s,
        client_s=args.client_s,
        worker_start_s=args.worker_start_s,
        cores_per_node=args.cores_per_node,
        persistent_workers=args.persistent_workers,
        probe=args.probe,
        s3=s3_config(args),
    )
    if args.plot:
        plot(job, args.plot)
    print(job.to_json(indent=2) if args.json else job.table())
