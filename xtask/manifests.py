"""Validates the Kubernetes manifests under deploy/ offline: `cargo xtask test` runs it with
the kubernetes-validate package from PyPI (xtask/src/manifests.rs makes its virtualenv).

Every directory with a kustomization.yaml is rendered the way kustomize renders it, for the
part of kustomize the manifests use (resources, namespace, images, patches: strategic merge
by the Kubernetes merge keys and RFC 6902 JSON patches), and every object of the result is
validated in strict mode (an unknown field is an error) against the schemas of Kubernetes
VERSION. A kustomization field or patch form this renderer does not know fails the check
rather than being skipped, so a green run means every object was checked as it would be
applied. Where kustomize (or kubectl's) is on PATH, it renders each kustomization too, and
its objects must be this renderer's. Then the objects are checked against each other: the plugin's --driver-name, the
CSIDriver's name, the registrar's registration path and the socket directory must agree, and
every path under kubelet's directory (the registration path, the socket, registration and
kubelet hostPaths, the plugin's mount of kubelet's directory) must be under the plugin's
--kubelet-dir (/var/lib/kubelet when not given).

The examples in DIR/examples/*.yaml (static PV, PVC and Pod per transport, applied with
`kubectl apply -f`, not kustomizations) are validated the same way, file by file, and checked
to hang together: each PV of the plugin's default driver is claimed by a PVC of the file (by
volumeName, storageClassName "", the same volumeMode), each PVC is used by a Pod of the file
(volumeMounts for a filesystem, volumeDevices for a raw block volume), and a
nodeStageSecretRef names a Secret of the file. That their volumeAttributes and secrets are
what the plugin accepts is csi/tests/examples.rs's part, through the plugin's own parser.

usage: manifests.py VERSION DIR
"""

import copy
import os
import shutil
import subprocess
import sys

import kubernetes_validate
import yaml

KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "resources", "images", "patches"}

# Kinds that have no namespace (kustomize's namespace transformer leaves them alone).
CLUSTER_SCOPED = {
    "Namespace",
    "CSIDriver",
    "CSINode",
    "StorageClass",
    "PersistentVolume",
    "PriorityClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "VolumeAttachment",
}

# Strategic merge: the lists Kubernetes merges element by element, and their merge keys
# (patchMergeKey in the API types). Every other list is replaced.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
}


class Invalid(Exception):
    pass


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def render(directory):
    """The objects the kustomization in `directory` produces."""
    path = os.path.join(directory, "kustomization.yaml")
    (k,) = load_yaml(path)
    unknown = set(k) - KNOWN_FIELDS
    if unknown:
        raise Invalid(f"{path}: this checker does not render {sorted(unknown)}")
    objects = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, r))
        if os.path.isdir(p):
            objects.extend(render(p))
        elif os.path.isfile(p):
            objects.extend(load_yaml(p))
        else:
            raise Invalid(f"{path}: resource {r} does not exist")
    for patch in k.get("patches", []):
        apply_patch(directory, path, patch, objects)
    for image in k.get("images", []):
        set_image(image, objects)
    if "namespace" in k:
        for o in objects:
            if o.get("kind") not in CLUSTER_SCOPED:
                o.setdefault("metadata", {})["namespace"] = k["namespace"]
    return objects


def apply_patch(directory, kpath, patch, objects):
    unknown = set(patch) - {"path", "target"}
    if unknown or "path" not in patch:
        raise Invalid(f"{kpath}: patch {patch}: only path (and target) are rendered")
    p = os.path.join(directory, patch["path"])
    docs = load_yaml(p)
    target = patch.get("target", {})
    if len(docs) == 1 and isinstance(docs[0], list):
        if not target:
            raise Invalid(f"{p}: a JSON patch needs a target")
        hits = [o for o in objects if matches(o, target)]
        if not hits:
            raise Invalid(f"{p}: no object matches the target {target}")
        for o in hits:
            json_patch(o, docs[0], p)
        return
    for doc in docs:
        sel = dict(target)
        sel.setdefault("kind", doc.get("kind"))
        sel.setdefault("name", doc.get("metadata", {}).get("name"))
        hits = [o for o in objects if matches(o, sel)]
        if not hits:
            raise Invalid(f"{p}: no object matches {sel}")
        for o in hits:
            merged = merge(o, doc, p)
            o.clear()
            o.update(merged)


def matches(obj, target):
    unknown = set(target) - {"kind", "name"}
    if unknown:
        raise Invalid(f"patch target {target}: only kind and name are rendered")
    return obj.get("kind") == target.get("kind", obj.get("kind")) and obj.get(
        "metadata", {}
    ).get("name") == target.get("name", obj.get("metadata", {}).get("name"))


def merge(base, patch, where, key=None):
    """Kubernetes' strategic merge of `patch` into `base`, for the lists MERGE_KEYS names."""
    if isinstance(patch, dict):
        if any(k.startswith("$") for k in patch):
            raise Invalid(f"{where}: directives ($patch...) are not rendered")
        if not isinstance(base, dict):
            return copy.deepcopy(patch)
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(out.get(k), v, where, k) if k in out else copy.deepcopy(v)
        return out
    if isinstance(patch, list) and key in MERGE_KEYS and isinstance(base, list):
        mk = MERGE_KEYS[key]
        out = copy.deepcopy(base)
        for item in patch:
            if not isinstance(item, dict) or mk not in item:
                raise Invalid(f"{where}: an element of {key} without its merge key {mk}")
            at = [i for i, b in enumerate(out) if b.get(mk) == item[mk]]
            if at:
                out[at[0]] = merge(out[at[0]], item, where)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def json_patch(obj, ops, where):
    for op in ops:
        kind = op.get("op")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = obj
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if isinstance(parent, list):
            last = len(parent) if last == "-" else int(last)
        if kind == "replace":
            if isinstance(parent, dict) and last not in parent:
                raise Invalid(f"{where}: replace of {op['path']}, which is not there")
            parent[last] = op["value"]
        elif kind == "add":
            if isinstance(parent, list):
                parent.insert(last, op["value"])
            else:
                parent[last] = op["value"]
        elif kind == "remove":
            del parent[last]
        elif kind == "test":
            # A guard before a patch by list index: the element must be the one meant.
            if parent[last] != op["value"]:
                raise Invalid(f"{where}: test of {op['path']}: {parent[last]!r} is not {op['value']!r}")
        else:
            raise Invalid(f"{where}: JSON patch op {kind!r} is not rendered")


def set_image(image, objects):
    name = image["name"]
    for o in objects:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            current = c.get("image", "")
            base = current.split("@")[0]
            # A tag's ':' is in the last path element; a registry's port is not.
            repo = base.rsplit(":", 1)[0] if ":" in base.split("/")[-1] else base
            if repo != name:
                continue
            tag = current[len(repo):]
            new = image.get("newName", repo)
            if "newTag" in image:
                tag = ":" + str(image["newTag"])
            if "digest" in image:
                tag = "@" + image["digest"]
            c["image"] = new + tag


def flag(args, name):
    """The values of `--name=value` in a container's args."""
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]


def check_driver_name(directory, objects):
    """The plugin, the CSIDriver, the registrar and the socket directory name one driver, and
    every path of kubelet's is under the plugin's --kubelet-dir."""
    drivers = [o["metadata"]["name"] for o in objects if o.get("kind") == "CSIDriver"]
    for o in objects:
        if o.get("kind") != "DaemonSet":
            continue
        spec = o["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in spec["containers"]}
        args = {n: c.get("args", []) for n, c in containers.items()}
        plugin = flag(args.get("lunkit-csi", []), "driver-name")
        if len(plugin) != 1:
            raise Invalid(f"{directory}: the lunkit-csi container needs one --driver-name")
        name = plugin[0]
        if drivers != [name]:
            raise Invalid(f"{directory}: --driver-name={name}, but the CSIDriver objects are {drivers}")
        kdirs = flag(args["lunkit-csi"], "kubelet-dir") or ["/var/lib/kubelet"]
        if len(kdirs) != 1:
            raise Invalid(f"{directory}: the lunkit-csi container has --kubelet-dir twice")
        kdir = kdirs[0]
        want = f"--kubelet-registration-path={kdir}/plugins/{name}/csi.sock"
        if want not in args.get("node-driver-registrar", []):
            raise Invalid(f"{directory}: the registrar needs {want}")
        host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
        for volume, path in [
            ("socket-dir", f"{kdir}/plugins/{name}"),
            ("registration-dir", f"{kdir}/plugins_registry"),
            ("kubelet-dir", kdir),
        ]:
            if host.get(volume) != path:
                raise Invalid(f"{directory}: volume {volume} is hostPath {host.get(volume)}, not {path}")
        # kubelet's paths reach the plugin as kubelet writes them: its directory must be
        # mounted at the same path, with its mounts going back to the host.
        mounts = [m for m in containers["lunkit-csi"].get("volumeMounts", []) if m["name"] == "kubelet-dir"]
        if [(m["mountPath"], m.get("mountPropagation")) for m in mounts] != [(kdir, "Bidirectional")]:
            raise Invalid(
                f"{directory}: lunkit-csi must mount kubelet-dir once, at {kdir} with "
                f"mountPropagation Bidirectional, not {mounts}"
            )


def kustomize_command():
    """kustomize itself, or kubectl's, when this machine has one."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def normalized(value, key=None):
    """`value` with the lists strategic merge merges sorted by their merge key: kustomize puts
    a patch's new elements first, this renderer last, and Kubernetes reads them as one."""
    if isinstance(value, dict):
        return {k: normalized(v, k) for k, v in value.items()}
    if isinstance(value, list):
        items = [normalized(v) for v in value]
        if key in MERGE_KEYS and all(isinstance(i, dict) for i in items):
            items.sort(key=lambda i: str(i.get(MERGE_KEYS[key])))
        return items
    return value


def check_with_kustomize(directory, objects, command):
    """kustomize renders `directory` to the same objects as this checker did."""
    done = subprocess.run(command + [directory], capture_output=True, text=True)
    if done.returncode != 0:
        raise Invalid(f"{directory}: `{' '.join(command)}` failed: {done.stderr.strip()}")
    theirs = {ident(o): normalized(o) for o in yaml.safe_load_all(done.stdout) if o}
    ours = {ident(o): normalized(o) for o in objects}
    if theirs.keys() != ours.keys():
        raise Invalid(f"{directory}: kustomize renders {sorted(theirs, key=str)}, this checker {sorted(ours, key=str)}")
    for i, o in ours.items():
        if theirs[i] != o:
            raise Invalid(f"{directory}: kustomize renders {i} otherwise than this checker")


def ident(o):
    return (o.get("kind"), o.get("metadata", {}).get("namespace"), o.get("metadata", {}).get("name"))


def validate_all(where, objects, version):
    """Each object valid in strict mode against `version`, and none twice."""
    seen = set()
    for o in objects:
        i = ident(o)
        if i in seen:
            raise Invalid(f"{where}: {i} twice")
        seen.add(i)
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            at = "/".join(str(p) for p in e.path)
            raise Invalid(f"{where}: {i[0]} {i[2]}: {at}: {e.message}") from None


# The driver name the examples use: the base's (an overlay's own name replaces it).
EXAMPLE_DRIVER = "csi.lunkit.invalid"


def check_example(path, objects):
    """A PV of the plugin, its PVC and a Pod using it, and the Secret the PV names."""
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o.get("kind"), []).append(o)
    pvs = [pv for pv in by_kind.get("PersistentVolume", []) if pv["spec"].get("csi")]
    if not pvs:
        raise Invalid(f"{path}: no PersistentVolume of the plugin (spec.csi)")
    for pv in pvs:
        name, csi = pv["metadata"]["name"], pv["spec"]["csi"]
        if csi.get("driver") != EXAMPLE_DRIVER:
            raise Invalid(f"{path}: PV {name}: driver {csi.get('driver')}, not {EXAMPLE_DRIVER}")
        if not csi.get("volumeAttributes"):
            raise Invalid(f"{path}: PV {name}: no volumeAttributes")
        if pv["spec"].get("storageClassName") != "":
            raise Invalid(f"{path}: PV {name}: a static PV needs storageClassName \"\"")
        mode = pv["spec"].get("volumeMode", "Filesystem")
        ref = csi.get("nodeStageSecretRef")
        if ref:
            secrets = [
                s for s in by_kind.get("Secret", [])
                if s["metadata"]["name"] == ref["name"] and s["metadata"].get("namespace") == ref["namespace"]
            ]
            if not secrets:
                raise Invalid(f"{path}: PV {name}: nodeStageSecretRef {ref} names no Secret of the file")
        pvcs = [c for c in by_kind.get("PersistentVolumeClaim", []) if c["spec"].get("volumeName") == name]
        if len(pvcs) != 1:
            raise Invalid(f"{path}: PV {name}: claimed by {len(pvcs)} PVCs of the file, not 1")
        pvc = pvcs[0]
        if pvc["spec"].get("storageClassName") != "" or pvc["spec"].get("volumeMode", "Filesystem") != mode:
            raise Invalid(f"{path}: PVC {pvc['metadata']['name']}: needs storageClassName \"\" and volumeMode {mode}")
        check_pod_uses(path, by_kind.get("Pod", []), pvc, mode)


def check_pod_uses(path, pods, pvc, mode):
    claim, ns = pvc["metadata"]["name"], pvc["metadata"].get("namespace")
    for pod in pods:
        if pod["metadata"].get("namespace") != ns:
            continue
        spec = pod["spec"]
        names = [v["name"] for v in spec.get("volumes", [])
                 if v.get("persistentVolumeClaim", {}).get("claimName") == claim]
        field = "volumeDevices" if mode == "Block" else "volumeMounts"
        used = [u for c in spec["containers"] for u in c.get(field, []) if u["name"] in names]
        if used:
            return
    raise Invalid(f"{path}: no Pod of the file uses PVC {claim} through {field}")


def check_examples(root, version):
    """Every DIR/examples/*.yaml, on its own; the number of files checked."""
    directory = os.path.join(root, "examples")
    files = sorted(f for f in os.listdir(directory) if f.endswith(".yaml")) if os.path.isdir(directory) else []
    for f in files:
        path = os.path.join(directory, f)
        objects = load_yaml(path)
        validate_all(path, objects, version)
        check_example(path, objects)
    return len(files)


def main():
    version, root = sys.argv[1], sys.argv[2]
    dirs = sorted(d for d, _, files in os.walk(root) if "kustomization.yaml" in files)
    if not dirs:
        print(f"manifests: no kustomization under {root}", file=sys.stderr)
        return 1
    failed = 0
    kustomize = kustomize_command()
    if not kustomize:
        print("manifests: no kustomize or kubectl here: rendered by this checker only", file=sys.stderr)
    for d in dirs:
        try:
            objects = render(d)
            validate_all(d, objects, version)
            check_driver_name(d, objects)
            if kustomize:
                check_with_kustomize(d, objects, kustomize)
            by = f", rendered alike by `{' '.join(kustomize)}`" if kustomize else ""
            print(f"manifests: {d}: {len(objects)} objects valid against Kubernetes {version}{by}")
        except (Invalid, yaml.YAMLError, OSError, KeyError, ValueError, IndexError) as e:
            print(f"manifests: {e}", file=sys.stderr)
            failed += 1
    try:
        n = check_examples(root, version)
        print(f"manifests: {root}/examples: {n} files valid against Kubernetes {version}")
    except (Invalid, yaml.YAMLError, OSError, KeyError, ValueError, IndexError) as e:
        print(f"manifests: {e}", file=sys.stderr)
        failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
