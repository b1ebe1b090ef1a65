"""hack/demo.py's pure parts (the demo itself runs a whole cluster: `make demo`)."""
from __future__ import annotations

import sys

import yaml

from conftest import REPO

sys.path.insert(0, str(REPO / "hack"))
import demo  # noqa: E402


def _example_documents():
    return [doc for path in sorted(demo.EXAMPLES.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_stand_ins_cover_every_claim_and_config_map_the_samples_use_but_do_not_define():
    documents = _example_documents()
    stand_ins = demo.sample_stand_ins(documents)
    claims, config_maps = set(), set()
    for doc in documents:
        demo._references(doc, claims, config_maps)
    defined = {(d["kind"], d["metadata"]["name"]) for d in documents + stand_ins}
    assert all(("PersistentVolumeClaim", c) in defined for c in claims)
    assert all(("ConfigMap", c) in defined for c in config_maps)
    # A claim the samples define themselves is left alone.
    assert not any(o["kind"] == "PersistentVolumeClaim" and ("PersistentVolumeClaim", o["metadata"]["name"]) in
                   {(d["kind"], d["metadata"]["name"]) for d in documents} for o in stand_ins)
    # Each stand-in claim is pre-bound to its own static volume.
    volumes = {o["metadata"]["name"]: o for o in stand_ins if o["kind"] == "PersistentVolume"}
    for claim in (o for o in stand_ins if o["kind"] == "PersistentVolumeClaim"):
        volume = volumes[claim["spec"]["volumeName"]]
        assert volume["spec"]["claimRef"] == {"namespace": demo.DEMO_NAMESPACE, "name": claim["metadata"]["name"]}
        assert set(claim["spec"]["accessModes"]) <= set(volume["spec"]["accessModes"])


def test_references_walks_nested_volumes_and_specs():
    claims, config_maps = set(), set()
    demo._references({"spec": {"model": {"pvc": {"claimName": "w"}},
                               "template": {"spec": {"volumes": [{"persistentVolumeClaim": {"claimName": "out"}},
                                                                 {"configMap": {"name": "texts"}}]}}}},
                     claims, config_maps)
    assert claims == {"w", "out"} and config_maps == {"texts"}


def test_a_deployment_serves_only_when_its_observed_generation_is_fully_ready():
    def ctd(generation, observed, ready, replicas):
        return {"metadata": {"generation": generation},
                "status": {"observedGeneration": observed, "readyReplicas": ready, "replicas": replicas}}

    assert demo._serving(ctd(2, 2, 3, 3))
    assert not demo._serving(ctd(2, 1, 3, 3))  # status of an older spec
    assert not demo._serving(ctd(2, 2, 2, 3))
    assert not demo._serving(ctd(1, 1, 0, 0))  # nothing serves
    assert not demo._serving({"metadata": {"generation": 1}})
