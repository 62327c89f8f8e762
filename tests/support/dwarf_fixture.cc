// A program for the DWARF tests (tests/unit/test_dwarf.cpp), compiled there by
// g++ and clang++ at -O0/-O2, -gdwarf-4/-gdwarf-5, with and without -gz, and
// read by heapprof's symbolizer and by addr2line. No #include: it compiles in
// a fraction of a second. Shapes covered: inline chains three deep, a static
// function (no linkage name), a template, an operator, a lambda, a member
// function, extern "C".
extern "C" void* malloc(unsigned long);
extern "C" void free(void*);

namespace fixture {

struct Buffer {
  int* data = nullptr;
  int size = 0;
  __attribute__((noinline)) void Fill(int n);
  inline int Sum() const {
    int s = 0;
    for (int i = 0; i < size; ++i) s += data[i];
    return s;
  }
  int operator[](int i) const { return data[i]; }
};

template <class T>
inline T Twice(T v) {
  return v * 2 + 1;
}

static inline int Square(int x) {
  if (x > 3) x = Twice(x) + 1;
  return x * x;
}

inline int Deep(int x) { return Square(x) + Twice(x); }

void Buffer::Fill(int n) {
  data = static_cast<int*>(malloc(sizeof(int) * static_cast<unsigned long>(n)));
  size = n;
  for (int i = 0; i < n; ++i) data[i] = Deep(i);
}

}  // namespace fixture

int Compute(int k) {
  fixture::Buffer b;
  b.Fill(k);
  int s = b.Sum() + b[0];
  free(b.data);
  return s + fixture::Twice(k);
}

extern "C" int c_entry(int x) { return Compute(x) + 1; }

int main(int argc, char**) {
  auto twice_compute = [](int v) { return Compute(v) + fixture::Twice(static_cast<long>(v)); };
  return (c_entry(argc) + static_cast<int>(twice_compute(argc))) & 1;
}
