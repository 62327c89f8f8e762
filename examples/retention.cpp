// retention: who keeps it alive. A request handler caches every parsed
// request in a session table that is never trimmed (the "leak" a heap profile
// only shows as "allocated in ParseRequest"), and drops one buffer on the
// floor (a true leak). The retention profile names the holder of each:
//   ./retention                      (writes retention.pb.gz)
//   go tool pprof -traces retention retention.pb.gz
//   go tool pprof -top retention retention.pb.gz
#define HEAPPROF_REPLACE_NEW_DELETE
#include <heapprof.hpp>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

struct Request {
  std::vector<char> body;
};

struct Session {
  int id = 0;
  std::vector<Request*> history;  // every request this session made: never trimmed
};

// The cache: sessions by id, kept for the life of the process.
std::map<int, Session*> g_sessions;

__attribute__((noinline)) Request* ParseRequest(int n) {
  auto* r = new Request;
  r->body.assign(4096 + n % 7, 'x');
  return r;
}

__attribute__((noinline)) Session* OpenSession(int id) {
  auto* s = new Session;
  s->id = id;
  return s;
}

__attribute__((noinline)) void Handle(int session_id, int n) {
  Session*& s = g_sessions[session_id];
  if (s == nullptr) s = OpenSession(session_id);
  s->history.push_back(ParseRequest(n));
}

char* volatile g_sink;

__attribute__((noinline)) void LogLine(int n) {
  char* line = new char[512];  // never freed, and the pointer is overwritten: a true leak
  std::snprintf(line, 512, "request %d", n);
  g_sink = line;
}

int main() {
  heapprof::SetSampleRate(1);  // every allocation: the paths are exact
  for (int n = 0; n < 2000; ++n) {
    Handle(n % 50, n);
    if (n % 100 == 0) LogLine(n);
  }
  g_sink = nullptr;
  if (!heapprof::WriteRetentionProfile("retention.pb.gz")) {
    std::fprintf(stderr, "cannot write retention.pb.gz\n");
    return 1;
  }
  std::printf("wrote retention.pb.gz: go tool pprof -traces retention retention.pb.gz\n");
  return 0;
}
