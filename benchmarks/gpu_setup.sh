# Sourced by the lab scripts that run on the device (carry .gpuwhl): $OUT, the server wheels
# in /tmp/site, the default model's tokenizer cache, the cp312 scheduler extension from
# .gpuwhl/sched312 (built here when it does not import), `stamp` for timed stage lines and
# `stage NAME LIMIT CMD...` (CMD under timeout LIMIT, its log $OUT/${STAGE_PREFIX}_NAME.log, the
# log's last ${TAIL:-14} lines echoed; LIMIT 0 or empty skips it).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpuwhl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD TSKERNELS_CACHE=$PWD/.gpuwhl/tokcache PYTHONUNBUFFERED=1
cp .gpuwhl/sched312/_core*.so scheduler/ 2>/dev/null
# NO_BUILD=1: kernel-only calls skip the extension build (no serving, no tskernels-bench script)
[ "${NO_BUILD:-0}" = 1 ] || python -c "import scheduler._core" 2>/dev/null || \
    python -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
stage() {
  local name=$1 limit=$2 log; shift 2
  [ "${limit:-0}" -gt 0 ] || return 0
  log="$OUT/${STAGE_PREFIX:-stage}_$name.log"
  stamp "$name (limit $limit s)"
  timeout -k 5 "$limit" "$@" > "$log" 2>&1
  echo "$name rc $?"; grep -v -i "warn\|USDT" "$log" | cut -c1-300 | tail -"${TAIL:-14}"
}
