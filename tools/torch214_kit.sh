#!/usr/bin/env bash
# A second torch on the GPU machine (issue 27): torch 2.14.1 (CUDA 13) beside the image's 2.11, in a
# folder of its own, without the package index (the GPU machine has none).
#
# Here, on a machine with the package index:
#   tools/torch214_kit.sh prepare [DIR]      download the wheels, check them, cut them into parts of
#                                            at most PART_BYTES, one folder per part (DIR/p00, p01, ...)
#                                            and write DIR/MANIFEST (wheel, size, sha256, parts)
#   tools/torch214_kit.sh calls [DIR]        one line per device call: the part folder it carries
# On the GPU machine, one `run` per part folder while the machine stays warm (a call carries at most
# 64 MiB with the working tree; carry=[".t214/pNN"]):
#   tools/torch214_kit.sh gather DIR/pNN STAGE     copy this call's part into STAGE (default /tmp/t214)
# and then, in the call that uses it:
#   tools/torch214_kit.sh install STAGE TARGET    join the parts, check each wheel against MANIFEST,
#                                                 pip install them into TARGET (--no-index --no-deps)
#   eval "$(tools/torch214_kit.sh env TARGET)"    PYTHONPATH and LD_LIBRARY_PATH for that torch
#   tools/torch214_kit.sh check                   torch's version, CUDA, and Generator.philox_state
#
# What the wheel pins and the image has (H200 image, 2026-12-03): torch 2.14.1 wants
# nvidia-nccl-cu13==2.30.7 (the image's NCCL is older: `undefined symbol: ncclCommResume` without
# it), nvidia-cudnn-cu13==9.24.0.43 (image 9.19.0.56), nvidia-cusparselt-cu13==0.8.1,
# nvidia-nvshmem-cu13==3.4.5, cuda-toolkit==13.0.3 (image 13.0.2) and triton~=3.8.0 (inductor only).
# The kit brings torch, NCCL and cuDNN; the image's other libraries come after them on
# LD_LIBRARY_PATH.  Seen on the H200 (2026-12-04): with the image's cuDNN 9.19 torch imports, but
# torch.backends.cudnn refuses it ("compiled against (9, 24, 0) but found runtime version
# (9, 19, 0)") and cuDNN attention with dropout fails (CUDNN_STATUS_BAD_PARAM; a reentrant recompute
# that lands on it crashed); with cuDNN 9.24 from this kit every cuDNN cell ran.  The image's
# cuSPARSELt, NVSHMEM and CUDA 13.0.2 libraries load and served every case.  24 parts: about
# 5 s of device time each, install about 30 s.  The machine has no `unzip`.
set -euo pipefail

TORCH_WHEEL_SPEC="torch==2.14.1"
NCCL_WHEEL_SPEC="nvidia-nccl-cu13==2.30.7"
CUDNN_WHEEL_SPEC="nvidia-cudnn-cu13==9.24.0.43"
PART_BYTES=56000000  # a part and the working tree (about 1.5 MB) stay under the 64 MiB a call carries
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_18_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)

die() { echo "torch214_kit: $*" >&2; exit 2; }

prepare() {
    local dir=${1:-.t214}
    local wheels="$dir/wheels"
    mkdir -p "$wheels"
    local platform_args=()
    for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platform_args[@]}" -d "$wheels" "$TORCH_WHEEL_SPEC" "$NCCL_WHEEL_SPEC" "$CUDNN_WHEEL_SPEC"
    rm -rf "$dir"/p[0-9][0-9]
    : > "$dir/MANIFEST"
    local n=0 whl name size sum parts part
    for whl in "$wheels"/*.whl; do
        name=$(basename "$whl")
        size=$(stat -c %s "$whl")
        sum=$(sha256sum "$whl" | cut -d' ' -f1)
        split -b "$PART_BYTES" -d -a 2 "$whl" "$wheels/$name.part"
        parts=0
        for part in "$wheels/$name".part*; do
            mkdir -p "$(printf '%s/p%02d' "$dir" "$n")"
            mv "$part" "$(printf '%s/p%02d/' "$dir" "$n")"
            n=$((n + 1)); parts=$((parts + 1))
        done
        echo "$name $size $sum $parts" >> "$dir/MANIFEST"
    done
    cp "$dir/MANIFEST" "$dir/p00/MANIFEST"  # travels with the first part
    echo "prepared $n parts in $dir (one device call each):"
    cat "$dir/MANIFEST"
}

calls() {
    local dir=${1:-.t214}
    [ -d "$dir/p00" ] || die "no parts in $dir: run 'prepare' first"
    ls -d "$dir"/p[0-9][0-9]
}

gather() {
    local part_dir=${1:?part folder} stage=${2:-/tmp/t214}
    [ -d "$part_dir" ] || die "$part_dir is not here: name it in the call's carry"
    mkdir -p "$stage"
    cp "$part_dir"/* "$stage"/
    echo "$(ls "$stage" | grep -c part) parts in $stage"
}

install() {
    local stage=${1:-/tmp/t214} target=${2:-/tmp/t214site}
    [ -f "$stage/MANIFEST" ] || die "$stage/MANIFEST missing: gather p00 first"
    local name size sum parts have
    while read -r name size sum parts; do
        have=$(ls "$stage/$name".part* 2>/dev/null | wc -l)
        [ "$have" -eq "$parts" ] || die "$name: $have of $parts parts in $stage (gather the others)"
        cat "$stage/$name".part* > "$stage/$name"
        [ "$(stat -c %s "$stage/$name")" -eq "$size" ] || die "$name: joined size differs from MANIFEST"
        echo "$sum  $stage/$name" | sha256sum --check --quiet || die "$name: sha256 differs from MANIFEST"
    done < "$stage/MANIFEST"
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$target" "$stage"/*.whl
    echo "installed into $target: $(cut -d' ' -f1 "$stage/MANIFEST" | tr '\n' ' ')"
}

env_lines() {
    local target=${1:-/tmp/t214site}
    # The kit's libraries first (NCCL, cuDNN: LD_LIBRARY_PATH wins over RUNPATH, so the image's
    # older ones must not come before them); then the image's other NVIDIA libraries (cuBLAS, ...),
    # which the new torch's RUNPATH ($ORIGIN/../../nvidia/...) cannot reach from the target folder.
    local libs="" d site
    for d in "$target"/nvidia/*/lib; do
        [ -d "$d" ] && libs="${libs:+$libs:}$d"
    done
    for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))'); do
        for d in "$site"/nvidia/*/lib; do
            [ -d "$d" ] && [ ! -d "$target/nvidia/$(basename "$(dirname "$d")")/lib" ] && libs="${libs:+$libs:}$d"
        done
    done
    echo "export PYTHONPATH=$target\${PYTHONPATH:+:\$PYTHONPATH}"
    echo "export LD_LIBRARY_PATH=$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
}

check() {
    python3 - <<'EOF'
import torch
print("torch", torch.__version__, "from", torch.__file__)
print("cuda available", torch.cuda.is_available(), "| cuda", torch.version.cuda,
      "| nccl", ".".join(map(str, torch.cuda.nccl.version())))
cudnn = torch._C._cudnn
print("cudnn compiled against", cudnn.getCompileVersion(), "| loaded", cudnn.getRuntimeVersion())
print("cudnn accepted by torch:", torch.backends.cudnn.version())
print("Generator.philox_state present:", hasattr(torch.Generator, "philox_state"))
if torch.cuda.is_available():
    torch.cuda.init()  # default_generators is empty until CUDA is initialised
    gen = torch.cuda.default_generators[0]
    print("philox_state(0) eagerly:", gen.philox_state(0))
EOF
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    calls) shift; calls "$@" ;;
    gather) shift; gather "$@" ;;
    install) shift; install "$@" ;;
    env) shift; env_lines "$@" ;;
    check) shift; check ;;
    *) die "usage: $0 prepare|calls|gather|install|env|check (the header says what each does)" ;;
esac
