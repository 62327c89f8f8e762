// heapprof: serving profiles over HTTP the way Go's net/http/pprof does.
//
//   heapprof::HttpServer server("127.0.0.1:6060");
//   // go tool pprof -http=: http://127.0.0.1:6060/debug/pprof/heap
//
// The server itself (background threads: a poll() loop and two builders) is compiled by the
// implementation unit: detail/6_serving/http_server.hpp. Paths, parameters,
// headers and limits: README.md, "Serving profiles over HTTP".
#pragma once

#include "heapprof/config.hpp"

#if defined(HEAPPROF_CXX17)

#include <cstdint>
#include <new>
#include <string_view>

namespace heapprof {

namespace detail {
struct HttpServerState;
HEAPPROF_LINKED_BEGIN
// Starts a server; never null. Throws (when `throw_errors` and exceptions are
// on) std::invalid_argument for a malformed address and std::system_error
// when it cannot listen; otherwise the state records the error.
HttpServerState* StartHttpServer(std::string_view listen, bool throw_errors);
void StopHttpServer(HttpServerState* state) noexcept;
std::uint16_t HttpServerPort(const HttpServerState* state) noexcept;
const char* HttpServerError(const HttpServerState* state) noexcept;
HEAPPROF_LINKED_END
}  // namespace detail

// Serves /debug/pprof/ (index), /debug/pprof/heap, allocs, peak, retention,
// symbol and cmdline (README: "Serving profiles over HTTP") as Go's net/http/pprof does
// where Go has the same path, from background threads; stops and joins them on
// destruction. `listen` is "host:port": numeric IPv4, "localhost", or
// bracketed IPv6; an empty host is 127.0.0.1 (not every interface, unlike
// Go); "0.0.0.0:port" or "[::]:port" to serve every interface; port 0 picks a
// free port (see port()).
class HttpServer {
 public:
  // Throws std::invalid_argument for a malformed address, std::system_error
  // when it cannot listen (port in use, ...). Built without exceptions, it
  // prints why on stderr instead, and serving() is false.
  explicit HttpServer(std::string_view listen = "127.0.0.1:6060")
      : state_(detail::StartHttpServer(listen, true)) {}
  // Never throws: check serving(), and error() for why not.
  HttpServer(std::string_view listen, const std::nothrow_t&) noexcept
      : state_(detail::StartHttpServer(listen, false)) {}
  ~HttpServer() { detail::StopHttpServer(state_); }
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  HttpServer(HttpServer&&) = delete;
  HttpServer& operator=(HttpServer&&) = delete;

  // True while the server runs: from a constructor that returned without
  // throwing (in a build with exceptions) until destruction, except in a
  // forked child (its copy does not serve) and once the program has closed
  // the server's descriptors; error() then says which.
  bool serving() const noexcept { return detail::HttpServerError(state_)[0] == '\0'; }
  // Why it is not serving; "" when it is.
  const char* error() const noexcept { return detail::HttpServerError(state_); }
  // The bound port (the chosen one for port 0); 0 when not serving.
  std::uint16_t port() const noexcept { return detail::HttpServerPort(state_); }

 private:
  detail::HttpServerState* state_;
};

}  // namespace heapprof

#endif  // HEAPPROF_CXX17
