#!/usr/bin/env python3
"""Writes the seed corpus for the importer fuzz targets: small algorithms in
both formats, built with the fixture generator (tests/fixtures/gen_fixtures.py)
for 2-3 ranks, JSON written compactly. Rerun after changing the generator;
the seeds are committed."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures"))
import gen_fixtures as g  # noqa: E402

XML = os.path.join(HERE, "corpus", "msccl_xml")
JSON = os.path.join(HERE, "corpus", "mscclpp_json")


def xml_seeds():
    os.makedirs(XML, exist_ok=True)
    n = 3
    g.write_xml(os.path.join(XML, "allreduce_ring_3.xml"),
                [("name", "ring"), ("proto", "LL"), ("nchannels", 1), ("nchunksperloop", n), ("ngpus", n),
                 ("coll", "allreduce"), ("inplace", 1)], g.allreduce_ring(n))
    g.write_xml(os.path.join(XML, "allreduce_allpairs_3.xml"),
                [("name", "ap"), ("nchunksperloop", n), ("ngpus", n), ("coll", "allreduce"), ("inplace", 1),
                 ("outofplace", 0)], g.allreduce_allpairs(n))
    g.write_xml(os.path.join(XML, "allgather_ring_3.xml"),
                [("name", "ag"), ("nchunksperloop", n), ("ngpus", n), ("coll", "all_gather"), ("inplace", 0),
                 ("outofplace", 1), ("minBytes", 0), ("maxBytes", 1 << 20)], g.allgather_ring(n))
    g.write_xml(os.path.join(XML, "reducescatter_ring_3.xml"),
                [("name", "rs"), ("nchunksperloop", n), ("ngpus", n), ("coll", "reduce_scatter"), ("inplace", 0),
                 ("redop", "nop")], g.reducescatter_ring(n))
    g.write_xml(os.path.join(XML, "alltoall_2.xml"),
                [("name", "a2a"), ("nchunksperloop", 2), ("ngpus", 2), ("coll", "alltoall"), ("inplace", 0)],
                g.alltoall_allpairs(2))
    g.write_xml(os.path.join(XML, "broadcast_root1_3.xml"),
                [("name", "bc"), ("nchunksperloop", 2), ("ngpus", 3), ("coll", "broadcast"), ("root", 1)],
                g.broadcast_chain(3, 1))
    g.write_xml(os.path.join(XML, "reduce_chain_3.xml"),
                [("name", "red"), ("nchunksperloop", 1), ("ngpus", 3), ("coll", "reduce")], g.reduce_chain(3))
    gpus, extra = g.allgather_inplace_copy(2)
    g.write_xml(os.path.join(XML, "allgather_copy_2.xml"),
                [("name", "taccl"), ("nchunksperloop", 2), ("ngpus", 2), ("coll", "allgather"), ("inplace", 1),
                 ("outofplace", 0)], gpus, gpu_extra=extra)


def json_seeds():
    os.makedirs(JSON, exist_ok=True)
    seeds = {
        "allreduce_allpairs_2.json": g.mscclpp_allreduce_allpairs(2),
        "allreduce_packet_3.json": g.mscclpp_allreduce_packet(3),
        "allreduce_packet_send_3.json": g.mscclpp_allreduce_packet_send(3),
        "allgather_port_2.json": g.mscclpp_allgather_port(2),
        "reducescatter_rre_2.json": g.mscclpp_reducescatter_rre(2),
        "alltoall_putget_3.json": g.mscclpp_alltoall(3),
        "allreduce_pipeline_sem_2.json": g.mscclpp_pipeline_sem(),
        "allreduce_nvls_2.json": g.mscclpp_nvls(2),
    }
    for name, p in seeds.items():
        with open(os.path.join(JSON, name), "w") as f:
            json.dump(p, f, separators=(",", ":"))


if __name__ == "__main__":
    xml_seeds()
    json_seeds()
