// Test helpers: a minimal blocking HTTP/1.1 client over loopback sockets, so
// the HTTP tests need nothing but the kernel (no curl).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

namespace heapprof_test {

// A connected socket to 127.0.0.1:port, or -1. `rcvbuf` > 0 shrinks the
// receive buffer first (a client that reads slowly).
int ConnectLoopback(std::uint16_t port, int rcvbuf = 0);

bool SendAll(int fd, const std::string& bytes);

// Everything until EOF, or until `timeout_ms` passes without the peer closing.
// `timed_out` (optional) says which.
std::string ReadAll(int fd, int timeout_ms = 30000, bool* timed_out = nullptr);

struct HttpResponse {
  int status = 0;                             // 0: no parseable response
  std::map<std::string, std::string> headers;  // names lowercased
  std::string head, body;  // body: chunked transfer coding undone
  bool chunked = false;     // Transfer-Encoding: chunked
  bool last_chunk = false;  // chunked: the zero-size last chunk arrived (the body is complete)
  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

HttpResponse ParseHttpResponse(const std::string& raw);

// Sends `request` as is on a new connection, ends the sending side, and reads
// the whole response.
HttpResponse RawRequest(std::uint16_t port, const std::string& request, int timeout_ms = 30000);

std::string RequestHead(const std::string& method, const std::string& target);

HttpResponse HttpGet(std::uint16_t port, const std::string& target, const std::string& method = "GET");

#ifdef HEAPPROF_TEST_SUPPORT_IMPLEMENTATION  // compiled once: tests/support/support_impl.cpp

int ConnectLoopback(std::uint16_t port, int rcvbuf) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::string ReadAll(int fd, int timeout_ms, bool* timed_out) {
  std::string out;
  char buf[16384];
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (timed_out) *timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      if (timed_out) *timed_out = true;
      return out;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

HttpResponse ParseHttpResponse(const std::string& raw) {
  HttpResponse r;
  const std::size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.compare(0, 9, "HTTP/1.1 ") != 0) return r;
  r.head = raw.substr(0, end + 4);
  r.body = raw.substr(end + 4);
  r.status = std::atoi(raw.c_str() + 9);
  std::size_t pos = raw.find("\r\n") + 2;
  while (pos < end) {
    const std::size_t eol = raw.find("\r\n", pos);
    const std::string line = raw.substr(pos, eol - pos);
    const std::size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value[0] == ' ') value.erase(0, 1);
      r.headers[name] = value;
    }
    pos = eol + 2;
  }
  if (r.Header("transfer-encoding") == "chunked") {
    r.chunked = true;
    std::string coded;
    coded.swap(r.body);
    std::size_t at = 0;
    for (;;) {
      const std::size_t eol = coded.find("\r\n", at);
      if (eol == std::string::npos) break;
      char* end = nullptr;
      const unsigned long size = std::strtoul(coded.c_str() + at, &end, 16);
      if (end == coded.c_str() + at) break;  // not a chunk size
      if (size == 0) {
        r.last_chunk = coded.compare(eol + 2, 2, "\r\n") == 0;
        break;
      }
      if (eol + 2 + size + 2 > coded.size()) {  // cut inside the chunk: what came
        r.body.append(coded, eol + 2, std::string::npos);
        break;
      }
      r.body.append(coded, eol + 2, size);
      at = eol + 2 + size + 2;
    }
  }
  return r;
}

HttpResponse RawRequest(std::uint16_t port, const std::string& request, int timeout_ms) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return HttpResponse{};
  SendAll(fd, request);
  ::shutdown(fd, SHUT_WR);
  const std::string raw = ReadAll(fd, timeout_ms);
  ::close(fd);
  return ParseHttpResponse(raw);
}

std::string RequestHead(const std::string& method, const std::string& target) {
  return method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: heapprof-test\r\n\r\n";
}

HttpResponse HttpGet(std::uint16_t port, const std::string& target, const std::string& method) {
  return RawRequest(port, RequestHead(method, target));
}

#endif  // HEAPPROF_TEST_SUPPORT_IMPLEMENTATION

}  // namespace heapprof_test
