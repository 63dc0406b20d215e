#!/usr/bin/env bash
# Which ONNX Runtime build `pip install edgespec` (and its extras) resolves to on each edge platform:
# dry resolutions with uv (pip's --platform evaluates environment markers for THIS host, so it cannot
# show another platform's choice). Nothing is installed. Usage: tools/resolve_platforms.sh [PYTHON]
set -euo pipefail
py=${1:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip install -q --disable-pip-version-check uv build
"$py" -m build -q --wheel --outdir "$work" . >/dev/null 2>&1
wheel=$(ls "$work"/edgespec-*.whl)
uv=$(dirname "$py")/uv
# wheels only for the compiled packages; pure-Python ones may come as sdists (PyYAML has no win_arm64 wheel)
binary="--only-binary onnxruntime --only-binary onnxruntime-gpu --only-binary onnxruntime-qnn \
--only-binary onnxruntime-directml --only-binary onnxruntime-openvino --only-binary numpy --only-binary tokenizers"
resolve() {   # PLATFORM REQUIREMENT [ENV...]
    local plat=$1 req=$2; shift 2
    printf '%-26s %-20s ' "$plat" "$req"
    echo "edgespec${req#edgespec} @ file://$wheel" | env "$@" "$uv" pip compile - --python-platform "$plat" \
        --python-version 3.11 $binary --no-header --no-annotate -q 2>&1 \
        | grep -Eio '^onnxruntime[a-z-]*==[0-9.]+|no solution found.*' | tr '\n' ' ' || true
    echo
}
for plat in x86_64-manylinux_2_28 aarch64-manylinux_2_28 aarch64-manylinux_2_17 x86_64-pc-windows-msvc \
            aarch64-pc-windows-msvc x86_64-apple-darwin; do
    resolve "$plat" edgespec
done
resolve aarch64-apple-darwin edgespec MACOSX_DEPLOYMENT_TARGET=14.0
resolve x86_64-pc-windows-msvc "edgespec[directml]"
resolve aarch64-pc-windows-msvc "edgespec[qnn]"
resolve x86_64-manylinux_2_28 "edgespec[openvino]"
