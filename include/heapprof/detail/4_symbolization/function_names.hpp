// heapprof: the short form of a demangled C++ name, as pprof displays names
// by default ("demangle=simple": no parameters, no template arguments, no
// return type): "void std::vector<int>::_M_realloc_insert<int>(...)" →
// "std::vector::_M_realloc_insert". Operators keep their symbol
// ("operator()", "operator<<", "operator new[]"), lambdas and
// "(anonymous namespace)" are kept whole.
#pragma once

#include <cstddef>
#include <cstring>
#include <initializer_list>

namespace heapprof {
namespace detail {

inline std::size_t ShortFunctionNameOf(const char* full, std::size_t len, char* out, std::size_t cap, int depth);

// Writes the short form of `full` into out[0..cap) (NUL-terminated) and
// returns its length; 0 when it does not fit or nothing would remain.
inline std::size_t ShortFunctionName(const char* full, char* out, std::size_t cap) {
  if (full == nullptr || cap == 0) return 0;
  std::size_t len = std::strlen(full);
  if (const char* clone = std::strstr(full, " [clone ")) len = static_cast<std::size_t>(clone - full);
  return ShortFunctionNameOf(full, len, out, cap, 0);
}

// full[0..len): the name, or (depth > 0) the declarator part of one.
inline std::size_t ShortFunctionNameOf(const char* full, std::size_t len, char* out, std::size_t cap, int depth) {
  std::size_t n = 0;
  std::size_t top_spaces[64];
  int spaces = 0;
  bool overflow = false;
  auto put = [&](char ch) {
    if (n + 1 < cap) out[n++] = ch;
    else overflow = true;
  };
  auto is_ident = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
  };
  int angle = 0, paren = 0;
  for (std::size_t i = 0; i < len; ++i) {
    const char ch = full[i];
    if (angle == 0 && paren == 0) {
      if (i + 21 <= len && std::strncmp(full + i, "(anonymous namespace)", 21) == 0) {
        for (std::size_t k = 0; k < 21; ++k) put(full[i + k]);
        i += 20;
        continue;
      }
      if (ch == '{') {  // {lambda(int)#1}, {unnamed type#1}: copied whole
        int braces = 0;
        for (; i < len; ++i) {
          put(full[i]);
          if (full[i] == '{') ++braces;
          if (full[i] == '}' && --braces == 0) break;
        }
        continue;
      }
      if (i + 8 <= len && std::strncmp(full + i, "operator", 8) == 0 && (i == 0 || !is_ident(full[i - 1])) &&
          !(i + 8 < len && is_ident(full[i + 8]))) {
        for (std::size_t k = 0; k < 8; ++k) put(full[i + k]);
        i += 8;
        if (i < len && full[i] == '(' && i + 1 < len && full[i + 1] == ')') {
          put('(');
          put(')');
          i += 1;
        } else if (i < len && (full[i] == ' ' || full[i] == '"')) {
          // "operator new[]", "operator delete", a conversion "operator int*",
          // a literal operator 'operator"" _km': everything up to the
          // parameter list, minus template arguments.
          int a = 0;
          for (; i < len && !(full[i] == '(' && a == 0); ++i) {
            if (full[i] == '<') ++a;
            else if (full[i] == '>' && a > 0) --a;
            else if (a == 0) put(full[i]);
          }
          --i;
        } else {
          // The symbol: "<" only as (part of) "<", "<<", "<=", "<=>"; after
          // any other symbol a '<' opens template arguments ("operator==<char>").
          const std::size_t op = i;
          for (; i < len && std::strchr("+-*/%^&|~!=<>,[]", full[i]) != nullptr; ++i) {
            if (full[i] == '<' && i > op && !(i - op == 1 && full[op] == '<')) break;
            put(full[i]);
          }
          --i;
        }
        continue;
      }
    }
    if (ch == '(' && angle == 0 && paren == 0 && i + 1 < len && (full[i + 1] == '*' || full[i + 1] == '&')) {
      // A function returning a pointer to a function or an array has its
      // name inside the declarator: "void (*ns::get_handler())(int)",
      // "int (*ns::Table::row(int))[4]". What the parentheses hold, once
      // past the '*'s and '&'s, is the name with its parameters: that is the
      // short name ("(*)" holds no parameter list: a conversion operator's type).
      int nest = 0;
      std::size_t close = i;
      for (; close < len; ++close) {
        if (full[close] == '(') ++nest;
        else if (full[close] == ')' && --nest == 0) break;
      }
      std::size_t open = i + 1;
      while (open < close && (full[open] == '*' || full[open] == '&' || full[open] == ' ')) ++open;
      if (depth < 8 && close < len && open < close && std::memchr(full + open, '(', close - open) != nullptr) {
        return ShortFunctionNameOf(full + open, close - open, out, cap, depth + 1);
      }
    }
    if (ch == '(' && angle == 0) {
      ++paren;
      continue;
    }
    if (ch == ')' && paren > 0) {
      // A parameter list's qualifiers go with it, wherever it is: a lambda
      // in a const method is "A::F() const::{lambda()#1}::operator()() const",
      // and the space before a mid-name "const" is no return type's end.
      if (--paren == 0) {
        for (bool again = true; again;) {
          again = false;
          for (const char* q : {" const", " volatile", " &&", " &", " noexcept"}) {
            const std::size_t k = std::strlen(q);
            if (i + k < len && std::strncmp(full + i + 1, q, k) == 0 &&
                !(i + 1 + k < len && is_ident(full[i + 1 + k]))) {
              i += k;
              again = true;
              break;
            }
          }
        }
      }
      continue;
    }
    if (paren > 0) continue;
    if (ch == '<') {
      ++angle;
      continue;
    }
    if (ch == '>' && angle > 0) {
      --angle;
      continue;
    }
    if (angle > 0) continue;
    if (ch == ' ' && spaces < 64) top_spaces[spaces++] = n;
    put(ch);
  }
  if (overflow) return 0;
  while (n > 0 && out[n - 1] == ' ') --n;
  // A return type before the name: cut at the last space that separates words
  // at the top level ("operator new" and lambdas never recorded theirs).
  std::size_t start = 0;
  for (int s = spaces - 1; s >= 0; --s) {
    if (top_spaces[s] < n) {
      start = top_spaces[s] + 1;
      break;
    }
  }
  if (start >= n) return 0;
  std::memmove(out, out + start, n - start);
  n -= start;
  out[n] = '\0';
  return n;
}

}  // namespace detail
}  // namespace heapprof
