#!/usr/bin/env bash
# examples/kubernetes/ as far as it can be checked without a Kubernetes cluster (none here): every
# file parses as YAML, and the runtime and the TrainJob hold together and follow Kubeflow Trainer's
# MPI runtime as its own runtimes do (docs/kubernetes.md): an OpenMPI mlPolicy.mpi with an ssh mount;
# replicated jobs `launcher` and `node` whose containers are named `node` (the only ones the MPI
# plugin gives the ssh keys and, on the launcher, the hostfile and OMPI_MCA_* settings); the launcher
# waits for the nodes to be ready, is the `trainer` step, and fails the JobSet at once; both run
# entrypoint.sh in a role it has, mount the TrainJob's volume where CONFIG points, and have a grace
# period; the TrainJob names the runtime and passes `launcher` first.
# Usage: kubernetes_yaml.sh SOURCE_DIR
set -euo pipefail
dir=$1/examples/kubernetes
/usr/bin/python3 - "$dir" <<'PY'
import os, re, sys, yaml
d = sys.argv[1]
docs = {}
for f in sorted(os.listdir(d)):
    if f.endswith(".yaml"):
        for doc in yaml.safe_load_all(open(os.path.join(d, f))):
            docs[doc["kind"]] = doc
print("  parsed:", ", ".join(sorted(docs)))
rt, job, pvc = docs["TrainingRuntime"], docs["TrainJob"], docs["PersistentVolumeClaim"]
roles = set(re.findall(r"^  (\w+)\)", open(os.path.join(d, "entrypoint.sh")).read(), re.M))
assert {"node", "launcher"} <= roles, roles

assert rt["apiVersion"] == job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
mpi = rt["spec"]["mlPolicy"]["mpi"]
assert mpi["mpiImplementation"] == "OpenMPI" and mpi["sshAuthMountPath"].startswith("/"), mpi
spec = rt["spec"]["template"]["spec"]
assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}, spec["successPolicy"]
assert spec["failurePolicy"]["maxRestarts"] > 0
jobs = {j["name"]: j for j in spec["replicatedJobs"]}
assert set(jobs) == {"launcher", "node"}, set(jobs)
launcher = jobs["launcher"]
assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}], launcher.get("dependsOn")
assert launcher["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
assert launcher["template"]["spec"]["backoffLimit"] == 0
for name, j in jobs.items():
    pod = j["template"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["name"] == "node", f"{name}: container {c['name']!r}: the MPI plugin configures containers named node only"
    assert c["command"] == ["/opt/shardlm/entrypoint.sh"] and c["args"][0] in roles and c["args"][0] == name, c
    assert pod["terminationGracePeriodSeconds"] >= 60, name
    vols = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        assert vols[m["name"]]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"], m
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    if name == "node":
        assert c["readinessProbe"]["tcpSocket"]["port"] == 2222
    else:
        config = {e["name"]: e["value"] for e in c["env"]}["CONFIG"]
        assert any(config.startswith(m + "/") for m in mounts), (config, mounts)
assert "ReadWriteMany" in pvc["spec"]["accessModes"]

ref = job["spec"]["runtimeRef"]
assert (ref["kind"], ref["name"], ref.get("apiGroup", "trainer.kubeflow.org")) == \
    ("TrainingRuntime", rt["metadata"]["name"], "trainer.kubeflow.org"), ref
t = job["spec"]["trainer"]
assert t["args"][0] == "launcher" and all(re.fullmatch(r"[\w.]+=\S+", a) for a in t["args"][1:]), t["args"]
assert t["numNodes"] >= 1 and t["numProcPerNode"] >= 1
config = {e["name"]: e["value"] for e in t["env"]}["CONFIG"]
print(f"  runtime {rt['metadata']['name']}: launcher + node jobs, containers 'node', OpenMPI over ssh; "
      f"TrainJob {job['metadata']['name']}: {t['numNodes']} nodes x {t['numProcPerNode']} ranks, CONFIG={config}")
PY
echo "kubernetes examples check passed"
