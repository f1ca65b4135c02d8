"""Validates the Kubernetes manifests under deploy/ offline: `cargo xtask test` runs it with
the kubernetes-validate package from PyPI (xtask/src/manifests.rs makes its virtualenv).

Every directory with a kustomization.yaml is rendered the way kustomize renders it, for the
part of kustomize the manifests use (resources, namespace, images, patches: strategic merge
by the Kubernetes merge keys and RFC 6902 JSON patches), and every object of the result is
validated in strict mode (an unknown field is an error) against the schemas of Kubernetes
VERSION. A kustomization field or patch form this renderer does not know fails the check
rather than being skipped, so a green run means every object was checked as it would be
applied. Then the objects are checked against each other: the plugin's --driver-name, the
CSIDriver's name, the registrar's registration path and the socket directory must agree.

usage: manifests.py VERSION DIR
"""

import copy
import os
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


def check_driver_name(directory, objects):
    """The plugin, the CSIDriver, the registrar and the socket directory name one driver."""
    drivers = [o["metadata"]["name"] for o in objects if o.get("kind") == "CSIDriver"]
    for o in objects:
        if o.get("kind") != "DaemonSet":
            continue
        spec = o["spec"]["template"]["spec"]
        args = {c["name"]: c.get("args", []) for c in spec["containers"]}
        plugin = [a.split("=", 1)[1] for a in args.get("lunkit-csi", []) if a.startswith("--driver-name=")]
        if len(plugin) != 1:
            raise Invalid(f"{directory}: the lunkit-csi container needs one --driver-name")
        name = plugin[0]
        if drivers != [name]:
            raise Invalid(f"{directory}: --driver-name={name}, but the CSIDriver objects are {drivers}")
        want = f"--kubelet-registration-path=/var/lib/kubelet/plugins/{name}/csi.sock"
        if want not in args.get("node-driver-registrar", []):
            raise Invalid(f"{directory}: the registrar needs {want}")
        sockets = [v["hostPath"]["path"] for v in spec["volumes"] if v["name"] == "socket-dir"]
        if sockets != [f"/var/lib/kubelet/plugins/{name}"]:
            raise Invalid(f"{directory}: socket-dir is {sockets}, not /var/lib/kubelet/plugins/{name}")


def main():
    version, root = sys.argv[1], sys.argv[2]
    dirs = sorted(d for d, _, files in os.walk(root) if "kustomization.yaml" in files)
    if not dirs:
        print(f"manifests: no kustomization under {root}", file=sys.stderr)
        return 1
    failed = 0
    for d in dirs:
        try:
            objects = render(d)
            seen = set()
            for o in objects:
                ident = (o.get("kind"), o.get("metadata", {}).get("namespace"), o.get("metadata", {}).get("name"))
                if ident in seen:
                    raise Invalid(f"{d}: {ident} twice")
                seen.add(ident)
                try:
                    kubernetes_validate.validate(o, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    where = "/".join(str(p) for p in e.path)
                    raise Invalid(f"{d}: {ident[0]} {ident[2]}: {where}: {e.message}") from None
            check_driver_name(d, objects)
            print(f"manifests: {d}: {len(objects)} objects valid against Kubernetes {version}")
        except (Invalid, yaml.YAMLError, OSError, KeyError, ValueError, IndexError) as e:
            print(f"manifests: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
