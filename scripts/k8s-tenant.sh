#!/usr/bin/env bash
# Onboards a tenant into a Kubernetes deployment of Tidemark, in one command:
#
#   scripts/k8s-tenant.sh NAME [OVERLAY]      (OVERLAY: deploy/k8s/overlays/tenant-example)
#
# writes OVERLAY/tenant-NAME: the tenant's namespace tidemark-tenant-NAME (../deploy/k8s/tenant:
# restricted Pod Security, default-deny NetworkPolicies, ResourceQuota, LimitRange) with its
# compute cluster `tenant_NAME` (Deployment, Service, ServiceAccount and Role
# tenant-NAME-compute*); lists it in OVERLAY/kustomization.yaml; and adds the cluster to the
# adapters' mapping in OVERLAY/adapter-compute.yaml. Then create its certificate and apply:
#
#   python scripts/k8s_secrets.py OVERLAY    # creates only the Secrets that are missing
#   kubectl apply -k OVERLAY
#
# and, in SQL, `CREATE CLUSTER tenant_NAME;`. NAME: a lowercase letter, then up to 39
# lowercase letters or digits (it names a namespace, Kubernetes objects and a SQL cluster).
set -euo pipefail

die() { echo "k8s-tenant: $*" >&2; exit 2; }

name=${1:-}
overlay=${2:-$(dirname "$0")/../deploy/k8s/overlays/tenant-example}
[[ $name =~ ^[a-z][a-z0-9]{0,39}$ ]] || die "usage: $0 NAME [OVERLAY]; NAME like acme (a-z, 0-9)"
[ -f "$overlay/kustomization.yaml" ] || die "$overlay has no kustomization.yaml"
[ -f "$overlay/adapter-compute.yaml" ] || die "$overlay has no adapter-compute.yaml"
grep -q '^resources:' "$overlay/kustomization.yaml" \
  || die "$overlay/kustomization.yaml has no resources: list"
grep -q -- '- name: TIDEMARK_COMPUTE *$' "$overlay/adapter-compute.yaml" \
  || die "$overlay/adapter-compute.yaml sets no TIDEMARK_COMPUTE"
dir=$overlay/tenant-$name
[ ! -e "$dir" ] || die "$dir exists already"

k8s=$(cd "$(dirname "$0")/../deploy/k8s" && pwd)
mkdir -p "$dir/compute"
# kustomize wants paths relative to the kustomization (GNU and BSD realpath differ here).
relative() { python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$@"; }
tenant_base=$(relative "$k8s/tenant" "$dir")
cluster_base=$(relative "$k8s/compute-cluster" "$dir/compute")
cluster=tenant_$name
namespace=tidemark-tenant-$name
prefix=tenant-$name-

cat >"$dir/kustomization.yaml" <<YAML
# The namespace of tenant \`$name\`: the tenant base (namespace, NetworkPolicies, quota and
# limits, settings) plus the tenant's compute cluster. Made by scripts/k8s-tenant.sh; patch
# the ResourceQuota \`tenant\` here if the tenant needs more.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $namespace
labels:
  - pairs:
      app.kubernetes.io/part-of: tidemark
      tidemark.dev/tenant: $name
    includeTemplates: true
resources:
  - $tenant_base
  - compute
YAML

cat >"$dir/compute/kustomization.yaml" <<YAML
# The tenant's compute cluster \`$cluster\`, in the tenant's namespace. Before it has anything
# to run, create the catalog cluster it serves: CREATE CLUSTER $cluster;
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $cluster_base
namePrefix: $prefix
labels:
  - pairs:
      tidemark.dev/cluster: $cluster
    includeSelectors: true
patches:
  - path: cluster.yaml
YAML

cat >"$dir/compute/cluster.yaml" <<YAML
# The catalog cluster this compute process serves, its certificate
# (tidemark://compute/$name/$cluster, made by scripts/k8s_secrets.py) and its size, within the
# tenant's quota. For executors on Kubernetes see the comments in
# deploy/k8s/overlays/tenant-example/tenant-example/compute/cluster.yaml.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: compute
spec:
  template:
    spec:
      containers:
        - name: compute
          env:
            - name: TIDEMARK_CLUSTER
              value: $cluster
      volumes:
        - name: tls
          secret:
            secretName: tidemark-tls-${prefix}compute
YAML

# List the tenant after the last entry of `resources:`.
awk -v entry="  - tenant-$name" '
  inside && !/^  - / { print entry; inside = 0; done = 1 }
  { print }
  /^resources:/ { inside = 1 }
  END { if (inside) print entry; else if (!done) exit 1 }
' "$overlay/kustomization.yaml" >"$overlay/kustomization.yaml.new" \
  || die "$overlay/kustomization.yaml has no resources: list"
mv "$overlay/kustomization.yaml.new" "$overlay/kustomization.yaml"

# Add the cluster to the adapters' TIDEMARK_COMPUTE mapping (the line after its name).
address=${prefix}compute.$namespace:6879
awk -v add=",$cluster=$address" '
  after && /^ *value: / { sub(/ *$/, ""); $0 = $0 add; after = 0; done = 1 }
  { print }
  /- name: TIDEMARK_COMPUTE *$/ { after = 1 }
  END { if (!done) exit 1 }
' "$overlay/adapter-compute.yaml" >"$overlay/adapter-compute.yaml.new" \
  || die "$overlay/adapter-compute.yaml sets no TIDEMARK_COMPUTE value"
mv "$overlay/adapter-compute.yaml.new" "$overlay/adapter-compute.yaml"

echo "tenant $name: $dir (namespace $namespace, cluster $cluster at $address)"
echo "next: python scripts/k8s_secrets.py $overlay && kubectl apply -k $overlay"
echo "then, in SQL: CREATE CLUSTER $cluster;"
