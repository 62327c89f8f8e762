#!/usr/bin/env bash
# Build checks: what a user meets when heapprof enters a real code base.
#
#   tests/build/check.sh [CXX...]     (default: g++ and clang++, whichever exist)
#
# Run by ctest as `build_checks`. Each check compiles (and sometimes links and
# runs) a small program from tests/build/*.cpp with the compilers given:
#   headers      every public header compiles alone, C++17/20/23, -Wall -Wextra
#                -Wpedantic -Werror and -Wshadow -Wconversion -Wsign-conversion
#                -Wold-style-cast -Wundef -Wcast-qual (g++: -Wuseless-cast), with
#                and without -fno-exceptions -fno-rtti
#   user_strict  a unit that uses the API (tests/build/uses_api.cpp: every
#                allocator constructor instantiated) under the same warnings, g++
#                adding -Weffc++: C++17, C++20 with -fno-exceptions -fno-rtti, C++23
#   impl_strict  the implementation unit with every hook (HEAPPROF_IMPLEMENTATION,
#                HEAPPROF_REPLACE_NEW_DELETE, HEAPPROF_REPLACE_MALLOC, plus
#                <heapprof/http.hpp>) under the same warnings, -Werror included:
#                C++17, C++20 with -fno-exceptions -fno-rtti, C++23 (-fsyntax-only)
#   lines        <heapprof.hpp> adds at most 5,000 preprocessed lines to a unit
#                that already includes <string> and <vector>
#   cxx14        -std=c++14 (and clang++ with no -std when its default is older
#                than C++17): exactly one error, "heapprof needs C++17"
#   no_impl      a program without HEAPPROF_IMPLEMENTATION fails to link, and
#                the linker's message names HEAPPROF_IMPLEMENTATION
#   impl_twice   two units defining HEAPPROF_IMPLEMENTATION fail to link
#   no_hooks     implementation without the hooks: the first profile prints
#                one stderr line saying the hooks are not installed
#   malloc_only  new/delete hooked, only malloc called before the writes: one
#                line says new/delete are hooked and malloc is not
#   static_init  C++20: a namespace-scope vector with heapprof::allocator is
#                constinit, as with std::allocator, so a static constructor of
#                another unit may fill it before its own unit's initializers
#                run (both link orders): nothing registered is lost
#   macros       the public headers define no macro a user could collide with
#                (only HEAPPROF_* and reserved names) and add no `using
#                namespace`; a unit defining the GCC attribute names as macros
#                (noinline, always_inline, visibility, ... as kernel-style code
#                does) compiles with the light API and as the implementation
#                unit with every hook, as it does with the standard headers
#   odd_flags    two user units (uses_api.cpp, two_units_main.cpp) built with
#                -O2 -flto, -O0, -Os, -D_GLIBCXX_DEBUG, -D_GLIBCXX_ASSERTIONS,
#                -static-libstdc++ (g++), -fvisibility=hidden -fno-exceptions
#                -fno-rtti, linked with an implementation unit built without
#                them: links (no duplicate definition under LTO), and
#                heapprof::allocator containers count exactly at rate 1
#   disabled     HEAPPROF_DISABLE (what an unsupported platform gets): the API
#                compiles, links and is a no-op; Write* return false
#   noexcept     every unit built with -std=c++17 -fno-exceptions -fno-rtti (and the
#                warnings above, so the implementation too): rate-1
#                totals exact to the byte, profiles written, bad_alloc thrown
#                the standard way, nothrow new returns null
#   dsos         two shared libraries that include <heapprof.hpp> and the
#                program, all -fvisibility=hidden: it links, labels set in one
#                are seen in the others, and allocations are counted once
#   readme       README.md's first C++ snippet compiles as pasted, runs, and
#                writes a profile
#   linkers      the same snippet linked by each of ld.bfd, gold and lld that
#                is installed, as a PIE and with -no-pie, runs and writes a
#                profile (gold made an undefined weak hidden symbol the load
#                address: the first allocation crashed)
#   static       the snippet linked -static and -static-pie runs and writes a
#                profile; HEAPPROF_REPLACE_MALLOC linked -static aborts at the
#                first malloc with one line saying why
# Exit status: the number of failed checks (0: all passed).
if [[ -n "${HEAPPROF_SKIP_BUILD_CHECKS:-}" ]]; then
  echo "build checks skipped (HEAPPROF_SKIP_BUILD_CHECKS is set)"
  exit 0
fi
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
inc="$root/include"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/heapprof-build-checks.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

compilers=("$@")
if ((${#compilers[@]} == 0)); then
  for c in g++ clang++; do command -v "$c" >/dev/null 2>&1 && compilers+=("$c"); done
fi

failures=0
pass() { printf 'ok    %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; failures=$((failures + 1)); }
# show FILE: the first lines of a compiler's output, indented, after a failure.
show() { sed -n '1,25s/^/      /p' "$1"; }

# The newest standard each compiler names: g++ 11+ knows c++23, clang 14 c++2b.
std23() {
  if echo 'int main(){}' | "$1" -std=c++23 -x c++ -fsyntax-only - 2>/dev/null; then echo c++23; else echo c++2b; fi
}

public_headers=(heapprof.hpp heapprof/config.hpp heapprof/api.hpp heapprof/labels.hpp
                heapprof/allocator.hpp heapprof/http.hpp)

for cxx in "${compilers[@]}"; do
  tag="$(basename "$cxx")"
  warn=(-Wall -Wextra -Wpedantic -Werror)
  # What strict code bases add, for the headers every unit includes and for the
  # implementation unit (impl_strict).
  strict=(-Wshadow -Wconversion -Wsign-conversion -Wold-style-cast -Wundef -Wcast-qual)
  [[ "$tag" == g++* ]] && strict+=(-Wuseless-cast)
  # ---- headers: each public header alone ------------------------------------
  bad=0
  for std in c++17 c++20 "$(std23 "$cxx")"; do
    for flags in "" "-fno-exceptions -fno-rtti"; do
      for h in "${public_headers[@]}"; do
        # shellcheck disable=SC2086
        if ! printf '#include <%s>\n' "$h" | "$cxx" -std=$std $flags "${warn[@]}" "${strict[@]}" -I"$inc" \
             -x c++ -fsyntax-only - >"$tmp/out" 2>&1; then
          fail "$tag headers: <$h> alone, -std=$std $flags"; show "$tmp/out"; bad=1
        fi
      done
    done
  done
  ((bad)) || pass "$tag headers: ${#public_headers[@]} public headers alone, C++17/20/23, strict warnings, with and without -fno-exceptions -fno-rtti"

  # ---- user_strict: a unit that uses the API, strict warnings ----------------------
  # The headers alone instantiate no template: a unit that uses them does
  # (uses_api.cpp: every allocator constructor, labels, the server). g++ adds
  # -Weffc++, which some code bases turn on: it warns in each unit that
  # instantiates a constructor leaving a member out of its initializer list.
  bad=0
  user=("${strict[@]}")
  [[ "$tag" == g++* ]] && user+=(-Weffc++)
  for config in "-std=c++17" "-std=c++20 -fno-exceptions -fno-rtti" "-std=$(std23 "$cxx")"; do
    # shellcheck disable=SC2086
    if ! "$cxx" $config "${warn[@]}" "${user[@]}" -I"$inc" -c "$here/uses_api.cpp" -o "$tmp/user.o" >"$tmp/out" 2>&1; then
      fail "$tag user_strict: uses_api.cpp, $config"; show "$tmp/out"; bad=1
    fi
  done
  ((bad)) || pass "$tag user_strict: a unit using the API (every allocator constructor), C++17/20/23, strict warnings$([[ "$tag" == g++* ]] && echo " + -Weffc++"), -Werror"

  # ---- impl_strict: the implementation unit, every hook, strict warnings ---------
  # Strict code bases compile their own units with these warnings; the unit that
  # defines HEAPPROF_IMPLEMENTATION is one of them. -fsyntax-only: the warnings
  # come from the front end, so this costs a few seconds, not a build.
  bad=0
  for config in "-std=c++17" "-std=c++20 -fno-exceptions -fno-rtti" "-std=$(std23 "$cxx")"; do
    # shellcheck disable=SC2086
    if ! printf '%s\n' '#define HEAPPROF_IMPLEMENTATION' '#define HEAPPROF_REPLACE_NEW_DELETE' \
           '#define HEAPPROF_REPLACE_MALLOC' '#include <heapprof.hpp>' '#include <heapprof/http.hpp>' |
         "$cxx" $config "${warn[@]}" "${strict[@]}" -I"$inc" -x c++ -fsyntax-only - >"$tmp/out" 2>&1; then
      fail "$tag impl_strict: the implementation unit with every hook, $config"; show "$tmp/out"; bad=1
    fi
  done
  ((bad)) || pass "$tag impl_strict: the implementation unit with every hook (+ <heapprof/http.hpp>), C++17/20/23, strict warnings, -Werror"

  # ---- lines: preprocessed cost of the light header ----------------------------
  base=$(printf '#include <string>\n#include <vector>\n' | "$cxx" -std=c++17 -E -P -x c++ - | wc -l)
  with=$(printf '#include <string>\n#include <vector>\n#include <heapprof.hpp>\n' |
         "$cxx" -std=c++17 -E -P -I"$inc" -x c++ - | wc -l)
  extra=$((with - base))
  if ((extra <= 5000)); then
    pass "$tag lines: <heapprof.hpp> adds $extra preprocessed lines to <string>+<vector> ($base -> $with)"
  else
    fail "$tag lines: <heapprof.hpp> adds $extra preprocessed lines (limit 5000)"
  fi

  # ---- cxx14: one clear error ---------------------------------------------------
  stds=(-std=c++14)
  default_std=$(echo '__cplusplus' | "$cxx" -E -P -x c++ - | tr -d ' L')
  ((default_std < 201703)) && stds+=("")
  for std in "${stds[@]}"; do
    # shellcheck disable=SC2086
    "$cxx" $std -I"$inc" -c "$here/uses_api.cpp" -o "$tmp/a.o" >"$tmp/out" 2>&1
    status=$?
    errors=$(grep -c 'error:' "$tmp/out")
    if ((status != 0)) && ((errors == 1)) && grep -q 'heapprof needs C++17' "$tmp/out"; then
      pass "$tag cxx14: ${std:-default standard ($default_std)}: one error line, 'heapprof needs C++17'"
    else
      fail "$tag cxx14: ${std:-default standard}: status $status, $errors error lines"; show "$tmp/out"
    fi
  done

  # ---- no_impl: a link error naming the macro ------------------------------------
  if "$cxx" -std=c++17 "${warn[@]}" -I"$inc" "$here/write_twice.cpp" -o "$tmp/no_impl" -pthread >"$tmp/out" 2>&1; then
    fail "$tag no_impl: linked without HEAPPROF_IMPLEMENTATION"
  elif grep -q 'undefined reference.*HEAPPROF_IMPLEMENTATION' "$tmp/out"; then
    pass "$tag no_impl: link error: $(grep -m1 -o 'undefined reference to .*' "$tmp/out" | cut -c1-110)"
  else
    fail "$tag no_impl: the link error does not name HEAPPROF_IMPLEMENTATION"; show "$tmp/out"
  fi

  # ---- impl_twice ------------------------------------------------------------------
  ok=1
  for i in 1 2; do
    "$cxx" -std=c++17 -O0 -I"$inc" -DHEAPPROF_IMPLEMENTATION -DHEAPPROF_TEST_UNIT=$i \
      -c "$here/implementation.cpp" -o "$tmp/impl$i.o" >"$tmp/out" 2>&1 || { ok=0; show "$tmp/out"; }
  done
  if ((ok)); then
    if "$cxx" "$tmp/impl1.o" "$tmp/impl2.o" -o "$tmp/twice" -pthread -ldl >"$tmp/out" 2>&1; then
      fail "$tag impl_twice: linked with HEAPPROF_IMPLEMENTATION in two units"
    elif grep -q 'multiple definition' "$tmp/out"; then
      pass "$tag impl_twice: link error: $(grep -m1 -o 'multiple definition of .*' "$tmp/out" | cut -c1-100)"
    else
      fail "$tag impl_twice: unexpected link output"; show "$tmp/out"
    fi
  else
    fail "$tag impl_twice: the implementation unit did not compile"
  fi

  # ---- no_hooks: one line on stderr ------------------------------------------------
  # impl1.o is an implementation unit without HEAPPROF_REPLACE_NEW_DELETE.
  if "$cxx" -std=c++17 -I"$inc" "$here/write_twice.cpp" "$tmp/impl1.o" -o "$tmp/no_hooks" -pthread -ldl \
       >"$tmp/out" 2>&1; then
    "$tmp/no_hooks" >/dev/null 2>"$tmp/err"
    status=$?
    lines=$(grep -c 'hooks are not installed' "$tmp/err")
    if ((status == 0)) && ((lines == 1)) && grep -q 'HEAPPROF_REPLACE_NEW_DELETE' "$tmp/err"; then
      pass "$tag no_hooks: one stderr line for two profiles: $(cut -c1-90 "$tmp/err")..."
    else
      fail "$tag no_hooks: status $status, $lines matching lines"; show "$tmp/err"
    fi
  else
    fail "$tag no_hooks: did not build"; show "$tmp/out"
  fi

  # ---- malloc_only: new/delete hooked, only malloc called: the line says so --------
  if "$cxx" -std=c++17 -I"$inc" "$here/malloc_only.cpp" -o "$tmp/malloc_only" -pthread -ldl >"$tmp/out" 2>&1; then
    "$tmp/malloc_only" >/dev/null 2>"$tmp/err"
    status=$?
    lines=$(grep -c 'operator new/delete are hooked (HEAPPROF_REPLACE_NEW_DELETE) and nothing has called them yet; malloc and free are not hooked' "$tmp/err")
    if ((status == 0)) && ((lines == 1)) && ! grep -q 'not installed' "$tmp/err"; then
      pass "$tag malloc_only: one stderr line for two profiles, naming what is hooked"
    else
      fail "$tag malloc_only: status $status, $lines matching lines"; show "$tmp/err"
    fi
  else
    fail "$tag malloc_only: did not build"; show "$tmp/out"
  fi

  # ---- static_init: constant-initialized containers, as with std::allocator -------
  # impl1.o is an implementation unit (above). Both link orders: the static
  # constructor runs before the registry's unit's initializers in one of them.
  if "$cxx" -std=c++20 -x c++ -fsyntax-only - <<<'constinit int x = 1;' >/dev/null 2>&1; then
    ok=1
    for order in "static_init_main.cpp static_init_registry.cpp" "static_init_registry.cpp static_init_main.cpp"; do
      # shellcheck disable=SC2086
      if (cd "$here" && "$cxx" -std=c++20 -O1 "${warn[@]}" -I"$inc" $order "$tmp/impl1.o" -o "$tmp/static_init" \
            -pthread -ldl) >"$tmp/out" 2>&1; then
        if ! "$tmp/static_init" >"$tmp/out" 2>&1; then
          fail "$tag static_init: $order: a registration was lost"; show "$tmp/out"; ok=0
        fi
      else
        fail "$tag static_init: $order: did not build"; show "$tmp/out"; ok=0
      fi
    done
    ((ok)) && pass "$tag static_init: constinit std::vector<int, heapprof::allocator<int>>, filled by another unit's static constructor in either order"
  fi

  # ---- macros: what the headers define, and user macros they must survive ----------
  # Every macro the public headers add beyond the standard headers they include
  # is HEAPPROF_* or a reserved name (the standard library's own, _X or __x).
  std_headers='#include <cstddef>\n#include <cstdint>\n#include <type_traits>\n#include <utility>\n#include <memory>\n#include <atomic>\n#include <initializer_list>\n#include <string_view>\n#include <new>\n#include <iosfwd>\n'
  # shellcheck disable=SC2059
  printf "$std_headers" | "$cxx" -std=c++17 -dM -E -x c++ - | sort >"$tmp/base_macros"
  # shellcheck disable=SC2059
  printf "$std_headers#include <heapprof.hpp>\n#include <heapprof/http.hpp>\n" |
    "$cxx" -std=c++17 -dM -E -I"$inc" -x c++ - | sort >"$tmp/with_macros"
  leaked=$(comm -13 "$tmp/base_macros" "$tmp/with_macros" | awk '{print $2}' | sed 's/(.*//' | grep -v -e '^HEAPPROF_' -e '^_')
  # shellcheck disable=SC2059
  base_using=$(printf "$std_headers" | "$cxx" -std=c++17 -E -P -x c++ - | grep -c 'using namespace')
  # shellcheck disable=SC2059
  with_using=$(printf "$std_headers#include <heapprof.hpp>\n#include <heapprof/http.hpp>\n" |
               "$cxx" -std=c++17 -E -P -I"$inc" -x c++ - | grep -c 'using namespace')
  # GCC attribute names are ordinary identifiers: code in the style of the
  # Linux kernel's compiler attributes defines some of them as macros. The
  # standard headers spell them __noinline__ etc. and compile regardless.
  attr_macros=""
  for m in noinline always_inline visibility tls_model weak noipa no_sanitize_address; do
    attr_macros+="#define $m \"a user's macro\"\n"
  done
  bad_attr=""
  # shellcheck disable=SC2059
  printf "$attr_macros#include <string>\n#include <vector>\n#include <mutex>\n#include <thread>\n" |
    "$cxx" -std=c++17 -x c++ -fsyntax-only - >"$tmp/out" 2>&1 || bad_attr="the standard headers"
  # shellcheck disable=SC2059
  { printf "$attr_macros"; cat "$here/uses_api.cpp"; } |
    "$cxx" -std=c++17 "${warn[@]}" -I"$inc" -x c++ -fsyntax-only - >"$tmp/out_user" 2>&1 || bad_attr+=" uses_api.cpp"
  # shellcheck disable=SC2059
  printf "$attr_macros#define HEAPPROF_REPLACE_NEW_DELETE\n#define HEAPPROF_REPLACE_MALLOC\n#include <heapprof.hpp>\n#include <heapprof/http.hpp>\n" |
    "$cxx" -std=c++17 "${warn[@]}" -I"$inc" -x c++ -fsyntax-only - >"$tmp/out_impl" 2>&1 || bad_attr+=" the implementation unit"
  if [[ -n "$leaked" ]]; then
    fail "$tag macros: the public headers define $(echo $leaked | tr '\n' ' ')"
  elif ((with_using != base_using)); then
    fail "$tag macros: the public headers add $((with_using - base_using)) using-directive(s)"
  elif [[ -n "$bad_attr" ]]; then
    fail "$tag macros: with the attribute names defined as macros:$bad_attr fail to compile"
    show "$tmp/out_user"; show "$tmp/out_impl"
  else
    pass "$tag macros: only HEAPPROF_* macros, no using-directive; the attribute names as user macros compile (API and implementation)"
  fi

  # ---- odd_flags: user units built the ways code bases build -------------------------
  bad=0
  odd=("-O2 -flto" "-O0" "-Os" "-O1 -D_GLIBCXX_DEBUG" "-O1 -D_GLIBCXX_ASSERTIONS"
       "-O2 -fvisibility=hidden -fno-exceptions -fno-rtti")
  [[ "$tag" == g++* ]] && odd+=("-O2 -static-libstdc++")
  for flags in "${odd[@]}"; do
    extra=()
    [[ "$tag" == clang* ]] && extra+=(-fsized-deallocation)
    if [[ "$flags" == *-flto* && "$tag" == clang* ]]; then
      # clang's LTO objects need a linker that reads LLVM bitcode.
      "$cxx" -flto -fuse-ld=lld -x c++ - -o "$tmp/lto" <<<'int main() { return 0; }' >/dev/null 2>&1 || continue
      extra+=(-fuse-ld=lld)
    fi
    # shellcheck disable=SC2086
    if "$cxx" -std=c++17 $flags "${extra[@]}" "${warn[@]}" -I"$inc" "$here/two_units_main.cpp" "$here/uses_api.cpp" \
         "$tmp/impl1.o" -o "$tmp/odd" -pthread -ldl >"$tmp/out" 2>&1; then
      if ! "$tmp/odd" >"$tmp/out" 2>&1; then
        fail "$tag odd_flags: $flags: the program failed"; show "$tmp/out"; bad=1
      fi
    else
      fail "$tag odd_flags: $flags: did not build"; show "$tmp/out"; bad=1
    fi
  done
  ((bad)) || pass "$tag odd_flags: two user units with -flto, -O0, -Os, _GLIBCXX_DEBUG/ASSERTIONS, hidden visibility without exceptions$([[ "$tag" == g++* ]] && echo ", -static-libstdc++"): exact"

  # ---- disabled: the documented no-op ----------------------------------------------
  if "$cxx" -std=c++17 "${warn[@]}" -DHEAPPROF_DISABLE -I"$inc" "$here/disabled.cpp" "$here/uses_api.cpp" \
       -o "$tmp/disabled" >"$tmp/out" 2>&1; then
    if "$tmp/disabled" >"$tmp/out" 2>&1; then
      pass "$tag disabled: HEAPPROF_DISABLE builds without threads or dl, and every call is a no-op"
    else
      fail "$tag disabled: the program failed"; show "$tmp/out"
    fi
  else
    fail "$tag disabled: did not build"; show "$tmp/out"
  fi

  # ---- noexcept: the whole program with -fno-exceptions -fno-rtti ------------------
  # C++17 here; C++20 without exceptions and RTTI is CI's clang stage (every
  # suite, clang) and its meson stage (the unit suite, gcc).
  for std in c++17; do
    nx=(-std=$std -O1 -g -fno-exceptions -fno-rtti "${warn[@]}")
    [[ "$tag" == clang* ]] && nx+=(-fsized-deallocation)
    if "$cxx" "${nx[@]}" -I"$inc" "$here/noexcept_main.cpp" "$here/uses_api.cpp" -o "$tmp/noexcept" \
         -pthread -ldl >"$tmp/out" 2>&1; then
      if "$tmp/noexcept" >"$tmp/out" 2>&1; then
        pass "$tag noexcept -std=$std: $(tail -n1 "$tmp/out")"
      else
        fail "$tag noexcept -std=$std: the program failed"; show "$tmp/out"
      fi
    else
      fail "$tag noexcept -std=$std: did not build"; show "$tmp/out"
    fi
  done
  # ---- dsos: shared libraries built with -fvisibility=hidden ---------------------
  # Two libraries that include <heapprof.hpp> and the program's implementation
  # unit, every unit -fvisibility=hidden -fvisibility-inlines-hidden (CMake's
  # CXX_VISIBILITY_PRESET hidden + VISIBILITY_INLINES_HIDDEN): one engine.
  vis=(-std=c++17 -O1 -fvisibility=hidden -fvisibility-inlines-hidden "${warn[@]}")
  [[ "$tag" == clang* ]] && vis+=(-fsized-deallocation)
  ok=1
  for lib in a b; do
    "$cxx" "${vis[@]}" -fPIC -shared -DHEAPPROF_CHECK_LIB=$lib -I"$inc" "$here/dso_lib.cpp" \
      -o "$tmp/libheapprof_check_$lib.so" >"$tmp/out" 2>&1 || { ok=0; show "$tmp/out"; }
  done
  if ((ok)) && "$cxx" "${vis[@]}" -I"$inc" "$here/dso_main.cpp" "$tmp/libheapprof_check_a.so" \
       "$tmp/libheapprof_check_b.so" -Wl,-rpath,"$tmp" -o "$tmp/dsos" -pthread -ldl >"$tmp/out" 2>&1; then
    if "$tmp/dsos" >"$tmp/out" 2>&1; then
      pass "$tag dsos: $(tail -n1 "$tmp/out")"
    else
      fail "$tag dsos: the program failed"; show "$tmp/out"
    fi
  else
    fail "$tag dsos: did not build"; show "$tmp/out"
  fi

  # ---- readme: the first snippet, as pasted --------------------------------------
  awk '/^```cpp$/ {on = 1; next} on && /^```$/ {exit} on {print}' "$root/README.md" >"$tmp/app.cpp"
  if "$cxx" -std=c++17 -O2 "${warn[@]}" "$tmp/app.cpp" -I"$inc" -pthread -ldl -o "$tmp/app" >"$tmp/out" 2>&1; then
    if (cd "$tmp" && ./app >"$tmp/out" 2>&1) && [[ -s "$tmp/heap.pb.gz" ]]; then
      pass "$tag readme: the first snippet builds as pasted and writes heap.pb.gz ($(stat -c %s "$tmp/heap.pb.gz") bytes)"
    else
      fail "$tag readme: the first snippet ran but wrote no profile"; show "$tmp/out"
    fi
    rm -f "$tmp/heap.pb.gz"
  else
    fail "$tag readme: the first snippet does not compile"; show "$tmp/out"
  fi

  # ---- linkers: the snippet linked by bfd, gold and lld ---------------------------
  "$cxx" -std=c++17 -O1 -I"$inc" -c "$tmp/app.cpp" -o "$tmp/app.o" >"$tmp/out" 2>&1 || show "$tmp/out"
  for ld in bfd gold lld; do
    echo 'int main() { return 0; }' >"$tmp/ld.cpp"
    if ! "$cxx" -fuse-ld=$ld "$tmp/ld.cpp" -o "$tmp/ld" >/dev/null 2>&1; then
      printf 'skip  %s linkers: -fuse-ld=%s: not installed\n' "$tag" "$ld"
      continue
    fi
    for pie in -pie -no-pie; do
      if "$cxx" -fuse-ld=$ld $pie "$tmp/app.o" -o "$tmp/app_ld" -pthread -ldl >"$tmp/out" 2>&1; then
        if (cd "$tmp" && ./app_ld >"$tmp/out" 2>&1) && [[ -s "$tmp/heap.pb.gz" ]]; then
          pass "$tag linkers: -fuse-ld=$ld $pie: runs and writes heap.pb.gz"
        else
          fail "$tag linkers: -fuse-ld=$ld $pie: the program failed (status $?)"; show "$tmp/out"
        fi
        rm -f "$tmp/heap.pb.gz"
      else
        fail "$tag linkers: -fuse-ld=$ld $pie: did not link"; show "$tmp/out"
      fi
    done
  done
done

# ---- static: a statically linked program (-static, -static-pie) --------------------
# new/delete replaced: runs and writes a profile. The malloc family replaced:
# there is no other malloc to forward to, and the first malloc says so in one
# line and aborts (before: a line that did not say why).
for cxx in "${compilers[@]}"; do
  tag="$(basename "$cxx")"
  if ! "$cxx" -static "$tmp/ld.cpp" -o "$tmp/ld" >/dev/null 2>&1; then
    printf 'skip  %s static: no static C library\n' "$tag"
    continue
  fi
  for mode in -static -static-pie; do
    if "$cxx" -std=c++17 -O1 -I"$inc" $mode "$tmp/app.cpp" -o "$tmp/app_static" -pthread >"$tmp/out" 2>&1; then
      if (cd "$tmp" && ./app_static >"$tmp/out" 2>&1) && [[ -s "$tmp/heap.pb.gz" ]]; then
        pass "$tag static: $mode with new/delete replaced runs and writes heap.pb.gz"
      else
        fail "$tag static: $mode: the program failed"; show "$tmp/out"
      fi
      rm -f "$tmp/heap.pb.gz"
    else
      fail "$tag static: $mode did not link"; show "$tmp/out"
    fi
  done
  printf '#define HEAPPROF_REPLACE_MALLOC\n#include <heapprof.hpp>\n#include <cstdlib>\nint main() { void* volatile p = std::malloc(10); std::free(p); return 0; }\n' >"$tmp/static_malloc.cpp"
  if "$cxx" -std=c++17 -O1 -I"$inc" -static "$tmp/static_malloc.cpp" -o "$tmp/static_malloc" -pthread >"$tmp/out" 2>&1; then
    (cd "$tmp" && ./static_malloc >"$tmp/out" 2>&1) 2>/dev/null  # (the shell's "Aborted" line)
    st=$?
    if ((st == 134)) && grep -q "a statically linked program has none to forward to" "$tmp/out"; then
      pass "$tag static: HEAPPROF_REPLACE_MALLOC says why it cannot run, and aborts"
    else
      fail "$tag static: HEAPPROF_REPLACE_MALLOC: status $st"; show "$tmp/out"
    fi
  else
    fail "$tag static: HEAPPROF_REPLACE_MALLOC did not link"; show "$tmp/out"
  fi
done

if ((failures)); then
  echo "$failures build check(s) failed"
else
  echo "all build checks passed (${compilers[*]})"
fi
exit "$failures"
