// libFuzzer target for the HTTP request parser and router behind
// heapprof::HttpServer (heapprof/detail/http_parser.hpp).
// HEAPPROF_FUZZ_CI_RUNS=450000 (2 s in CI's fuzz stage)
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       tests/fuzz/fuzz_http_request.cpp -o fuzz_http_request
//   ./fuzz_http_request -max_total_time=60 [corpus_dir]
//
// Input: byte 0 picks a split point, the rest is what a client sent. The
// server sees bytes in pieces and calls FindHeadEnd / CheckPartialHead after
// each read, so the checks are the ones it relies on:
//   - FindHeadEnd is monotone: on any prefix it returns 0 or the full answer;
//   - CheckPartialHead never rejects a prefix of a head that ParseHead accepts;
//   - ParseHead on an accepted head yields a GET-able shape (method token,
//     path starting with '/', body size within the limit), and PlanRequest
//     always gives an action or a 4xx/5xx with a one-line reason, a redirect
//     to a clean path with no byte a header line cannot hold;
//   - the symbolz address walk terminates and finds only non-zero addresses.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "heapprof/detail/6_serving/http_parser.hpp"

namespace http = heapprof::detail::http;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

bool OneLine(const char* reason) {
  const std::size_t n = std::strlen(reason);
  return n > 0 && std::memchr(reason, '\n', n) == nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t split_seed = data[0];
  const std::string_view all(reinterpret_cast<const char*>(data + 1), size - 1);
  // As the server buffers it: at most kMaxHeadBytes + 1 bytes before a 431.
  const std::string_view buf = all.substr(0, http::kMaxHeadBytes + 1);

  const std::size_t end = http::FindHeadEnd(buf);
  Check(end <= buf.size());
  const std::size_t split = buf.empty() ? 0 : split_seed * buf.size() / 256;
  const std::size_t early = http::FindHeadEnd(buf.substr(0, split));
  Check(early == 0 || early == end);

  if (end == 0) {
    const http::Error e = http::CheckPartialHead(buf);
    if (e.status != 0) Check(e.status == 400 && OneLine(e.reason));
    return 0;
  }

  http::Request req;
  const http::Error e = http::ParseHead(buf.substr(0, end), req);
  if (e.status != 0) {
    Check(e.status >= 400 && e.status < 600 && OneLine(e.reason));
    return 0;
  }
  // An accepted head was never rejected while it arrived.
  for (std::size_t cut : {split, end / 2, end - 1}) {
    const std::string_view prefix = buf.substr(0, cut);
    if (http::FindHeadEnd(prefix) == 0) Check(http::CheckPartialHead(prefix).status == 0);
  }
  Check(!req.method.empty() && req.method.size() <= http::kMaxMethodBytes);
  Check(!req.path.empty() && req.path[0] == '/');
  Check(req.path.find('\0') == std::string::npos);
  Check(req.content_length <= http::kMaxBodyBytes);

  const http::Plan plan = http::PlanRequest(req);
  if (plan.action == http::Action::kError) {
    Check(plan.error.status >= 400 && plan.error.status < 600 && OneLine(plan.error.reason));
  } else if (plan.action == http::Action::kDelta) {
    Check(plan.seconds >= 1 && plan.seconds <= http::kMaxDeltaSeconds);
  } else if (plan.action == http::Action::kSymbol) {
    Check(plan.body_bytes == 0 || req.method == "POST");
    std::size_t count = 0;
    http::ForEachSymbolAddress(all.substr(end), [&](std::uint64_t pc) {
      Check(pc != 0);
      ++count;
    });
    Check(count <= all.size());
  }
  if (plan.action == http::Action::kRedirect) {
    // Go's ServeMux redirect, for any request: to a clean path (a fixed
    // point of the cleaning) that fits in a header line.
    Check(!plan.location.empty() && plan.location[0] == '/');
    for (char c : plan.location) Check(static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f);
    const std::string_view path = std::string_view(plan.location).substr(0, plan.location.find('?'));
    Check(path.find('%') != std::string_view::npos || http::CleanPath(path) == path);
  } else if (plan.action != http::Action::kSymbol && plan.action != http::Action::kError) {
    Check(req.content_length == 0);
  }
  return 0;
}
