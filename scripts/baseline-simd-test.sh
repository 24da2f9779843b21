#!/usr/bin/env bash
# The tests that compare float results, once more with numpy on its baseline SIMD path: every optional CPU
# feature numpy dispatches to on this machine (AVX2/FMA3, AVX-512, ...) is turned off with
# NPY_DISABLE_CPU_FEATURES, so numpy's float32/float64 transcendentals (pow, exp, log, sin, cos) take the
# code path of a CPU without them. A tolerance or a pinned value that holds on one CPU family only fails here
# on the other path. The list is computed at run time: numpy refuses to disable a feature of its baseline,
# and the names differ between numpy versions. Arguments go to pytest (`scripts/baseline-simd-test.sh -x`).
# Needs .venv-core (scripts/test.sh makes it), or the interpreter named by PYTHON_CORE.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON_CORE:-.venv-core/bin/python}

# numpy >= 2 keeps the CPU dispatch tables in numpy._core, numpy 1.26 in numpy.core
disabled=$(env -u NPY_DISABLE_CPU_FEATURES "$PYTHON" -c '
try:
    from numpy._core import _multiarray_umath as umath
except ImportError:
    from numpy.core import _multiarray_umath as umath
print(" ".join(f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)))')
export NPY_DISABLE_CPU_FEATURES="$disabled"
echo "numpy baseline SIMD path: NPY_DISABLE_CPU_FEATURES=\"$NPY_DISABLE_CPU_FEATURES\""

# numpy warns about a name it does not know and ignores it: check that nothing it dispatches to is left on
"$PYTHON" -W error -c '
try:
    from numpy._core import _multiarray_umath as umath
except ImportError:
    from numpy.core import _multiarray_umath as umath
left = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
assert not left, f"still dispatched to: {left}"
print("baseline:", " ".join(umath.__cpu_baseline__))'

# Every test folder or file that compares float results: the numeric core, the tables against their pinned
# bytes and their references, the check's tolerances, the properties, the inference outputs against their
# numpy references, the Python client, and the sample project of docs/python.md (a float32 RoPE of its own).
TESTS=(
  tests/models
  tests/api/test_golden_tables.py
  tests/api/test_rope_variants.py
  tests/api/test_rounded_once.py
  tests/api/test_tables_api.py
  tests/api/test_bias_api.py
  tests/api/test_presets.py
  tests/api/test_check.py
  tests/api/test_check_ulp.py
  tests/api/test_check_ranking.py
  tests/api/test_check_combinations.py
  tests/api/test_check_search.py
  tests/api/test_properties.py
  tests/api/test_properties_axes.py
  tests/api/test_properties_relative.py
  tests/api/test_python_client.py
  tests/inference
  tests/deploy/test_sample_project.py
)
"$PYTHON" -m pytest -q -p no:cacheprovider -m "not torch and not converters" "${TESTS[@]}" "$@"
