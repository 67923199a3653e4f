// disc standalone runtime: disc_runtime.h, running a folder written by disc.save with no Python.
//
// Compiled in one translation unit after ral_cpu.cc (disc.runtime.ral_build), so it calls the RAL
// table (`disc_ral_cpu`) and the packed-weight bookkeeping (`disc_ral_cpu_hold_constants`)
// directly. Everything here lives in `disc_standalone`; only the C API is exported.
//
// Loading reads interface.txt with the rules of disc/runtime/interface.py (the same grammar, the
// same checks, errors naming the file and line), refuses programs that need PyTorch, a GPU, another
// RAL ABI or another CPU, checks program.so and constants.bin against their sizes and SHA-256
// digests, then dlopens program.so. Nothing read from a file is trusted: every count, offset and
// size is bounds-checked before it is used.
//
// A call checks the inputs as the Python host does (disc/runtime/checks.py: the same messages),
// asks the program for the output dims and workspace size (`disc_shapes`), allocates what the
// caller did not give, runs (`disc_run`) and describes each output. A loaded model is never written
// after disc_model_load returns, so calls may run on any number of threads at once; each thread
// keeps its own workspace between calls. No C++ exception leaves an exported function.

#include "disc_runtime.h"
#include "ral.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

// Defined in ral_cpu.cc, earlier in this translation unit (declared again so this file reads alone).
extern "C" void disc_ral_cpu_hold_constants(const void* const* constants, int64_t n, int32_t held);

// Only the C API is exported, whatever -fvisibility the library is built with.
#pragma GCC visibility push(hidden)

namespace disc_standalone {

// ---------------------------------------------------------------------------------------------
// Errors: thrown inside, turned into a disc_error at the C boundary.

struct Failure {
  int32_t status;
  std::string message;
};

[[noreturn]] void raise(int32_t status, std::string message) { throw Failure{status, std::move(message)}; }

__attribute__((format(printf, 1, 2))) std::string strf(const char* fmt, ...) {
  char small[512];
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  const int n = std::vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  std::string out;
  if (n >= 0 && static_cast<size_t>(n) < sizeof small) {
    out.assign(small, static_cast<size_t>(n));
  } else if (n >= 0) {
    out.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(&out[0], out.size(), fmt, again);
    out.resize(static_cast<size_t>(n));
  }
  va_end(again);
  return out;
}

void set_error(disc_error* error, int32_t status, const char* message) {
  if (error == nullptr) return;
  error->status = status;
  std::snprintf(error->message, sizeof error->message, "%s", message);
}

// Runs `body` (which throws Failure on error) and reports its outcome through `error`.
template <class Body>
int32_t guarded(disc_error* error, Body&& body) noexcept {
  try {
    body();
    set_error(error, DISC_OK, "");
    return DISC_OK;
  } catch (const Failure& f) {
    set_error(error, f.status, f.message.c_str());
    return f.status;
  } catch (const std::bad_alloc&) {
    set_error(error, DISC_ERROR_MEMORY, "disc runtime: out of memory");
    return DISC_ERROR_MEMORY;
  } catch (const std::exception& e) {
    char buf[sizeof(disc_error::message)];
    std::snprintf(buf, sizeof buf, "disc runtime: internal error: %s", e.what());
    set_error(error, DISC_ERROR_RUN, buf);
    return DISC_ERROR_RUN;
  } catch (...) {
    set_error(error, DISC_ERROR_RUN, "disc runtime: internal error (an unknown exception)");
    return DISC_ERROR_RUN;
  }
}

// Python's repr() of a string, for the messages that mirror the Python parser's and checker's.
std::string repr(const std::string& s) {
  const bool doubled = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = doubled ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7f) {
      out += strf("\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Element types

constexpr int32_t kNumDtypes = 13;
const char* const kDtypeNames[kNumDtypes] = {"f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "i1", "u16", "u32", "u64"};
constexpr size_t kDtypeSizes[kNumDtypes] = {2, 2, 4, 8, 1, 1, 2, 4, 8, 1, 2, 4, 8};

bool known_dtype(int32_t dtype) { return dtype >= 0 && dtype < kNumDtypes; }

int32_t dtype_of(const std::string& name) {
  for (int32_t d = 0; d < kNumDtypes; ++d)
    if (name == kDtypeNames[d]) return d;
  return -1;
}

// numel * element size of `shape`, or -1 when a dim is negative or the product overflows int64.
int64_t byte_size(const int64_t* shape, int32_t rank, int32_t dtype) {
  int64_t n = static_cast<int64_t>(kDtypeSizes[dtype]);
  for (int32_t i = 0; i < rank; ++i) {
    if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n)) return -1;
  }
  return n;
}

std::string shape_text(const int64_t* shape, int32_t rank) {  // Python's tuple repr: (), (3,), (2, 3)
  std::string out = "(";
  for (int32_t i = 0; i < rank; ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (rank == 1 ? ",)" : ")");
}

// ---------------------------------------------------------------------------------------------
// SHA-256 (FIPS 180-4)

class Sha256 {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (used_ > 0) {
      const size_t take = n < 64 - used_ ? n : 64 - used_;
      std::memcpy(buf_ + used_, p, take);
      used_ += take, p += take, n -= take;
      if (used_ < 64) return;
      compress(buf_);
      used_ = 0;
    }
    for (; n >= 64; p += 64, n -= 64) compress(p);
    std::memcpy(buf_, p, n);
    used_ = n;
  }

  std::string hex() {  // finishes the digest: call once
    const uint64_t bits = total_ * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (used_ != 56) update(&zero, 1);
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(length, 8);
    std::string out;
    for (uint32_t word : h_) out += strf("%08x", word);
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress(const uint8_t* block) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t{block[4 * t]} << 24 | uint32_t{block[4 * t + 1]} << 16 | uint32_t{block[4 * t + 2]} << 8 | uint32_t{block[4 * t + 3]};
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[t] + w[t];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf_[64] = {};
  size_t used_ = 0;
  uint64_t total_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Memory: 64-byte-aligned blocks, released with std::free (what disc_free does).

constexpr int64_t kAlign = 64;

void* aligned_block(int64_t bytes) {  // null when out of memory or absurdly large
  if (bytes < 0 || bytes > INT64_MAX - kAlign) return nullptr;
  const int64_t size = (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (static_cast<uint64_t>(size) > SIZE_MAX) return nullptr;
  return std::aligned_alloc(kAlign, static_cast<size_t>(size));
}

struct FreeBlock {
  void operator()(void* p) const { std::free(p); }
};
using Block = std::unique_ptr<void, FreeBlock>;

// The calling thread's workspace, kept between calls (a fresh multi-megabyte buffer comes from the
// OS as pages that every call would fault in again) and freed when the thread exits. It grows by
// at least half, and the old block is freed before the new one is taken.
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
  ~Workspace() { std::free(data); }

  void* at_least(int64_t need) {
    need = std::max<int64_t>(need, 1);
    if (data != nullptr && bytes >= need) return data;
    const int64_t size = std::max(need, bytes + bytes / 2);
    std::free(data);
    data = aligned_block(size);
    bytes = data != nullptr ? size : 0;
    if (data == nullptr) raise(DISC_ERROR_MEMORY, strf("cannot allocate a workspace of %" PRId64 " bytes", need));
    return data;
  }
};

thread_local Workspace tls_workspace;

// ---------------------------------------------------------------------------------------------
// Files

// The host digest: SHA-256 of "<machine>\n" followed by the lines of /proc/cpuinfo's first block
// that start with "model name" or "flags" (toolchain._host_identity in the Python package).
const std::string& host_digest() {
  static const std::string digest = [] {
    std::string identity;
    struct utsname u;
    if (uname(&u) == 0) identity = u.machine;
    identity += "\n";
    if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
      char* line = nullptr;
      size_t cap = 0;
      ssize_t n;
      while ((n = getline(&line, &cap, f)) > 0) {
        const std::string text(line, static_cast<size_t>(n));
        if (text.rfind("model name", 0) == 0 || text.rfind("flags", 0) == 0) identity += text;
        if (text.find_first_not_of(" \t\n\r\v\f\x1c\x1d\x1e\x1f") == std::string::npos) break;
      }
      std::free(line);
      std::fclose(f);
    }
    Sha256 h;
    h.update(identity.data(), identity.size());
    return h.hex();
  }();
  return digest;
}

// An open regular file, closed on scope exit.
struct File {
  int fd = -1;
  int64_t size = 0;
  ~File() {
    if (fd >= 0) close(fd);
  }
};

// Opens `path` (named `what` in messages) for reading; fails with DISC_ERROR_FILE.
void open_file(File& file, const std::string& path, const std::string& folder, const char* what) {
  file.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) raise(DISC_ERROR_FILE, strf("saved program %s: cannot read %s (%s)", folder.c_str(), what, std::strerror(errno)));
  struct stat st;
  if (fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode))
    raise(DISC_ERROR_FILE, strf("saved program %s: %s is not a regular file", folder.c_str(), what));
  file.size = static_cast<int64_t>(st.st_size);
}

// Reads up to `n` bytes (fewer only at the end of the file); returns how many, or -1 on error.
int64_t read_fully(int fd, void* into, int64_t n) {
  int64_t got = 0;
  auto* p = static_cast<char*>(into);
  while (got < n) {
    const size_t chunk = static_cast<size_t>(std::min<int64_t>(n - got, int64_t{1} << 30));
    const ssize_t r = read(fd, p + got, chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += r;
  }
  return got;
}

// ---------------------------------------------------------------------------------------------
// interface.txt (disc/runtime/interface.py holds the grammar and the writer)

constexpr const char* kMagic = "disc-program-interface 1";
constexpr int64_t kMaxInterfaceBytes = int64_t{64} << 20;

enum DimKind { kStatic, kSymbol, kComputed };
enum OutputKind { kBuffer, kInput, kConstant, kSame };

struct Dim {
  DimKind kind = kStatic;
  int64_t value = 0;   // kStatic: the size
  int32_t symbol = -1; // kSymbol: index into Interface::symbols (resolved after parsing)
};

struct Tensor {
  std::string name;
  int32_t dtype = 0;
  std::vector<std::string> dims;   // as written: "768", "batch", "?"
  std::vector<Dim> parsed;         // meaningful for inputs and constants
  std::vector<const char*> texts;  // dims[i].c_str(), then a null: disc_tensor_info::dims
  std::string quoted;              // repr(name), for messages
  int32_t rank() const { return static_cast<int32_t>(dims.size()); }
};

struct SymbolRule {
  std::string name;
  int64_t lo = 0, hi = -1, divisor = 1;  // hi -1: unbounded
};

struct ConstantEntry {
  Tensor spec;
  int64_t offset = 0, nbytes = 0;
};

struct OutputEntry {
  OutputKind kind = kBuffer;
  int64_t where = 0;      // buffer, input or earlier output index; the constant's index for kConstant
  std::string constant;   // kConstant: its name as written
  Tensor spec;
};

struct Interface {
  std::string name, host;
  int64_t abi = 0;
  std::map<std::string, std::pair<int64_t, std::string>> files;  // name -> (bytes, sha256)
  std::vector<std::string> needs;
  std::vector<SymbolRule> symbols;
  std::vector<Tensor> inputs;
  std::vector<ConstantEntry> constants;
  std::map<std::string, size_t> constant_index;  // name -> index in `constants`
  std::vector<std::string> arguments;
  std::vector<std::pair<int32_t, int64_t>> buffers;  // (dtype, rank)
  std::vector<OutputEntry> outputs;
  bool data_dependent = false;
};

// The text a program's disc_signature() returns for this interface (signature_text in
// disc/codegen/cpu/signature.py): input ranks, buffers as dtype:rank, constants, data_dependent.
std::string program_signature(const Interface& iface) {
  std::string ranks, buffers;
  for (const Tensor& t : iface.inputs) ranks += (ranks.empty() ? "" : " ") + std::to_string(t.rank());
  for (const auto& b : iface.buffers) buffers += (buffers.empty() ? "" : " ") + std::string(kDtypeNames[b.first]) + ":" + std::to_string(b.second);
  return "inputs " + ranks + "; buffers " + buffers + "; constants " + std::to_string(iface.arguments.size()) + "; data_dependent " +
         (iface.data_dependent ? "1" : "0");
}

// A rule of a line broken: the message of Python's ValueError.
struct LineError {
  std::string message;
};

[[noreturn]] void bad_line(std::string message) { throw LineError{std::move(message)}; }

bool is_name(const std::string& w) {
  if (w.empty()) return false;
  for (unsigned char c : w)
    if (c < '!' || c > '~') return false;
  return true;
}

bool is_hex64(const std::string& w) {
  if (w.size() != 64) return false;
  for (char c : w)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool all_digits(const std::string& w) {
  if (w.empty()) return false;
  for (char c : w)
    if (c < '0' || c > '9') return false;
  return true;
}

// Digits to an int64; false when it does not fit.
bool to_int64(const std::string& digits, int64_t& out) {
  int64_t v = 0;
  for (char c : digits)
    if (__builtin_mul_overflow(v, int64_t{10}, &v) || __builtin_add_overflow(v, int64_t{c - '0'}, &v)) return false;
  out = v;
  return true;
}

int64_t parse_int(const std::string& w, int64_t lo = 0) {  // `-?[0-9]{1,19}`, at least lo
  const bool negative = !w.empty() && w[0] == '-';
  const std::string digits = negative ? w.substr(1) : w;
  int64_t v = 0;
  if (!all_digits(digits) || digits.size() > 19 || !to_int64(digits, v) || (negative ? -v : v) < lo)
    bad_line(strf("%s is not an integer >= %" PRId64, repr(w).c_str(), lo));
  return negative ? -v : v;
}

const std::string& parse_name(const std::string& w) {
  if (!is_name(w)) bad_line(repr(w) + " is not a name");
  return w;
}

int32_t parse_dtype(const std::string& w) {
  const int32_t d = dtype_of(w);
  if (d < 0) bad_line("unknown dtype " + repr(w));
  return d;
}

// dtype, rank, then `rank` dims (a number, or a name: a symbol or "?").
Tensor parse_spec(const std::string& name, const std::vector<std::string>& words) {
  Tensor t;
  t.name = name;
  t.dtype = parse_dtype(words[0]);
  const int64_t rank = parse_int(words[1]);
  if (rank > DISC_MAX_RANK || static_cast<int64_t>(words.size()) != 2 + rank)
    bad_line(strf("rank %" PRId64 " needs %" PRId64 " dims", rank, rank));
  for (size_t i = 2; i < words.size(); ++i) {
    const std::string& w = words[i];
    Dim d;
    if (all_digits(w)) {
      if (!to_int64(w, d.value)) bad_line(repr(w) + " is too large for a dim");
    } else {
      d.kind = parse_name(w) == "?" ? kComputed : kSymbol;
    }
    t.dims.push_back(w);
    t.parsed.push_back(d);
  }
  return t;
}

// One line after the first; true at "end".
bool parse_line(Interface& iface, const std::vector<std::string>& w) {
  const std::string& head = w[0];
  const size_t n = w.size();
  if (head == "end" && n == 1) return true;
  if (head == "name" && n == 2) {
    iface.name = parse_name(w[1]);
  } else if (head == "abi" && n == 2) {
    iface.abi = parse_int(w[1]);
  } else if (head == "host" && n == 2 && is_hex64(w[1])) {
    iface.host = w[1];
  } else if (head == "file" && n == 4 && is_hex64(w[3])) {
    const int64_t bytes = parse_int(w[2]);  // Python evaluates the value before the key
    iface.files[parse_name(w[1])] = {bytes, w[3]};
  } else if (head == "needs" && n >= 2) {
    std::string reason = w[1];
    for (size_t i = 2; i < n; ++i) reason += " " + w[i];
    iface.needs.push_back(reason);
  } else if (head == "symbol" && n == 5) {
    SymbolRule s;
    s.name = parse_name(w[1]);
    s.lo = parse_int(w[2]);
    s.hi = w[3] == "inf" ? -1 : parse_int(w[3]);
    s.divisor = parse_int(w[4], 1);
    iface.symbols.push_back(s);
  } else if (head == "input" && n >= 4) {
    const std::string& name = parse_name(w[1]);
    iface.inputs.push_back(parse_spec(name, std::vector<std::string>(w.begin() + 2, w.end())));
  } else if (head == "constant" && n >= 6) {
    const std::string& name = parse_name(w[1]);
    std::vector<std::string> words{w[2]};
    words.insert(words.end(), w.begin() + 5, w.end());
    ConstantEntry c;
    c.spec = parse_spec(name, words);
    for (const Dim& d : c.spec.parsed)
      if (d.kind != kStatic) bad_line("a constant's dims are numbers");
    c.offset = parse_int(w[3]);
    c.nbytes = parse_int(w[4]);
    iface.constants.push_back(std::move(c));
  } else if (head == "argument" && n == 2) {
    iface.arguments.push_back(parse_name(w[1]));
  } else if (head == "buffer" && n == 3) {
    const int32_t dtype = parse_dtype(w[1]);
    iface.buffers.emplace_back(dtype, parse_int(w[2]));
  } else if (head == "output" && n >= 5 && (w[1] == "buffer" || w[1] == "input" || w[1] == "constant" || w[1] == "same")) {
    OutputEntry o;
    o.kind = w[1] == "buffer" ? kBuffer : w[1] == "input" ? kInput : w[1] == "constant" ? kConstant : kSame;
    if (o.kind == kConstant)
      o.constant = parse_name(w[2]);
    else
      o.where = parse_int(w[2]);
    o.spec = parse_spec("output" + std::to_string(iface.outputs.size()), std::vector<std::string>(w.begin() + 3, w.end()));
    iface.outputs.push_back(std::move(o));
  } else if (head == "data_dependent" && n == 2 && (w[1] == "0" || w[1] == "1")) {
    iface.data_dependent = w[1] == "1";
  } else {
    bad_line("not a line of the interface's grammar");
  }
  return false;
}

std::vector<std::string> split(const std::string& text, char sep) {  // Python's str.split(sep)
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = text.find(sep, start);
    if (at == std::string::npos) {
      out.push_back(text.substr(start));
      return out;
    }
    out.push_back(text.substr(start, at - start));
    start = at + 1;
  }
}

// interface.py's _check, in its order and with its messages; then what this runtime needs beyond
// it (every copy it makes is sized from the file alone): distinct symbols, outputs of kind input,
// constant and same of their source's dtype and rank, buffers of at most DISC_MAX_RANK dims.
void check_interface(Interface& iface, const std::string& where) {
  auto need = [&](bool cond, const std::string& what) {
    if (!cond) raise(DISC_ERROR_FILE, where + ": " + what);
  };
  need(!iface.name.empty() && iface.abi > 0 && !iface.host.empty(), "name, abi and host are required");
  std::map<std::string, size_t> input_names;
  for (size_t i = 0; i < iface.inputs.size(); ++i) input_names.emplace(iface.inputs[i].name, i);
  if (input_names.size() != iface.inputs.size()) {
    std::string names = "[";
    for (size_t i = 0; i < iface.inputs.size(); ++i) names += (i ? ", " : "") + repr(iface.inputs[i].name);
    need(false, "input names repeat: " + names + "]");
  }
  std::map<std::string, size_t> symbols;
  for (size_t s = 0; s < iface.symbols.size(); ++s) symbols.emplace(iface.symbols[s].name, s);
  for (Tensor& t : iface.inputs) {
    for (size_t a = 0; a < t.parsed.size(); ++a) {
      Dim& d = t.parsed[a];
      if (d.kind != kSymbol) continue;
      const auto found = symbols.find(t.dims[a]);
      need(found != symbols.end(), "input " + repr(t.name) + " has dim " + repr(t.dims[a]) + ", which is no symbol");
      d.symbol = static_cast<int32_t>(found->second);
    }
  }
  int64_t at = 0;
  for (size_t i = 0; i < iface.constants.size(); ++i) {
    const ConstantEntry& c = iface.constants[i];
    need(iface.constant_index.emplace(c.spec.name, i).second, "constant " + repr(c.spec.name) + " is listed twice");
    std::vector<int64_t> shape;
    for (const Dim& d : c.spec.parsed) shape.push_back(d.value);
    need(byte_size(shape.data(), c.spec.rank(), c.spec.dtype) == c.nbytes,
         strf("constant %s: %" PRId64 " bytes is not its shape's", repr(c.spec.name).c_str(), c.nbytes));
    at += (kAlign - at % kAlign) % kAlign;
    need(c.offset == at, strf("constant %s is at offset %" PRId64 ", where constants.bin holds it at %" PRId64, repr(c.spec.name).c_str(), c.offset, at));
    need(!__builtin_add_overflow(at, c.nbytes, &at) && at <= INT64_MAX - kAlign, "the constants end beyond any file's size");
  }
  if (!iface.constants.empty()) {
    auto bin = iface.files.find("constants.bin");
    need(bin != iface.files.end() && bin->second.first == at, strf("the constants end at byte %" PRId64 ", not at constants.bin's size", at));
  }
  // A program-cache entry's parameters stay in the model (it says so in a `needs` line; such a
  // program is refused after parsing).
  const bool needs = !iface.needs.empty();
  for (const std::string& a : iface.arguments) need(needs || iface.constant_index.count(a) > 0, "an argument names no constant");
  for (size_t k = 0; k < iface.outputs.size(); ++k) {
    OutputEntry& o = iface.outputs[k];
    if (o.kind == kBuffer) {
      need(o.where < static_cast<int64_t>(iface.buffers.size()), strf("output %zu names buffer %" PRId64 ", which does not exist", k, o.where));
      const auto& b = iface.buffers[static_cast<size_t>(o.where)];
      need(b.first == o.spec.dtype && b.second == o.spec.rank(), strf("output %zu is not its buffer's dtype and rank", k));
    } else if (o.kind == kInput) {
      need(o.where < static_cast<int64_t>(iface.inputs.size()), strf("output %zu passes input %" PRId64 " through, which does not exist", k, o.where));
    } else if (o.kind == kConstant) {
      const auto found = iface.constant_index.find(o.constant);
      need(needs || found != iface.constant_index.end(), strf("output %zu names constant %s, which is not listed", k, repr(o.constant).c_str()));
      o.where = found != iface.constant_index.end() ? static_cast<int64_t>(found->second) : -1;
    } else {
      need(o.where < static_cast<int64_t>(k), strf("output %zu repeats output %" PRId64 ", which does not come before it", k, o.where));
    }
  }
  // Beyond interface.py's checks:
  need(symbols.size() == iface.symbols.size(), "a symbol is listed twice");
  for (size_t k = 0; k < iface.outputs.size(); ++k) {
    const OutputEntry& o = iface.outputs[k];
    if (o.where < 0) continue;  // a constant the folder does not hold (needs)
    const auto from = static_cast<size_t>(o.where);
    const Tensor* source = o.kind == kInput ? &iface.inputs[from] : o.kind == kConstant ? &iface.constants[from].spec : o.kind == kSame ? &iface.outputs[from].spec : nullptr;
    need(source == nullptr || (source->dtype == o.spec.dtype && source->rank() == o.spec.rank()), strf("output %zu is not the dtype and rank of what it passes on", k));
  }
  for (size_t b = 0; b < iface.buffers.size(); ++b)
    need(iface.buffers[b].second <= DISC_MAX_RANK, strf("buffer %zu has rank %" PRId64 ", more than %d", b, iface.buffers[b].second, DISC_MAX_RANK));
}

void parse_interface(const std::string& text, const std::string& where, Interface& iface) {
  std::vector<std::string> lines = split(text, '\n');
  if (lines[0] != kMagic) raise(DISC_ERROR_FILE, where + ": line 1 must be '" + kMagic + "'");
  bool ended = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (ended) {
      if (!line.empty()) raise(DISC_ERROR_FILE, strf("%s line %zu: text after 'end'", where.c_str(), i + 1));
      continue;
    }
    try {
      ended = parse_line(iface, split(line, ' '));
    } catch (const LineError& e) {
      raise(DISC_ERROR_FILE, strf("%s line %zu: %s: %s", where.c_str(), i + 1, e.message.c_str(), repr(line.substr(0, 120)).c_str()));
    }
  }
  if (!ended) raise(DISC_ERROR_FILE, where + ": no 'end' line (the file is cut short)");
  check_interface(iface, where);
}

// ---------------------------------------------------------------------------------------------
// The model

using AbiFn = int32_t (*)(void);
using ShapesFn = int32_t (*)(const int64_t*, int64_t*, int64_t*, disc_ral_ctx*);
using RunFn = int32_t (*)(const disc_ral*, disc_ral_ctx*, const int64_t*, void* const*, void* const*, void* const*, void*, int64_t*);

struct Model {
  std::string folder;
  Interface iface;
  void* library = nullptr;
  ShapesFn shapes = nullptr;
  RunFn run = nullptr;
  Block constants;                     // constants.bin, 64-byte aligned
  std::vector<void*> arguments;        // the program's constant table
  bool held = false;                   // the RAL holds `arguments` (packed weight copies)
  int64_t input_dims = 0;              // dims of every input, concatenated
  std::vector<int64_t> buffer_start;   // where each buffer's dims start in the output dims
  int64_t output_dims = 0;             // dims of every buffer, concatenated

  ~Model() {
    if (held) disc_ral_cpu_hold_constants(const_cast<const void* const*>(arguments.data()), static_cast<int64_t>(arguments.size()), 0);
    if (library != nullptr) dlclose(library);
  }

  const void* constant_data(int64_t index) const {
    return static_cast<const char*>(constants.get()) + iface.constants[static_cast<size_t>(index)].offset;
  }
};

std::string read_interface(const std::string& path, const std::string& folder) {
  File file;
  open_file(file, path, folder, "interface.txt");
  if (file.size > kMaxInterfaceBytes) raise(DISC_ERROR_FILE, strf("saved program %s: interface.txt is larger than %" PRId64 " bytes", folder.c_str(), kMaxInterfaceBytes));
  std::string text(static_cast<size_t>(file.size), '\0');
  const int64_t got = read_fully(file.fd, &text[0], file.size);
  if (got < 0) raise(DISC_ERROR_FILE, strf("saved program %s: cannot read interface.txt (%s)", folder.c_str(), std::strerror(errno)));
  text.resize(static_cast<size_t>(got));
  return text;
}

[[noreturn]] void damaged(const Model& m, const char* file) {
  raise(DISC_ERROR_FILE, strf("saved program %s: %s is damaged (its size or SHA-256 differs from interface.txt)", m.folder.c_str(), file));
}

// Reads a listed file whole into `into` (64-byte aligned) if `into` is given, else only hashes it;
// fails unless its size and digest are the interface's.
void verify(const Model& m, const char* name, Block* into) {
  const auto entry = m.iface.files.find(name);
  const int64_t expected = entry->second.first;
  File file;
  open_file(file, m.folder + "/" + name, m.folder, name);
  if (file.size != expected) damaged(m, name);
  Sha256 h;
  if (into != nullptr) {
    into->reset(aligned_block(expected));
    if (!*into) raise(DISC_ERROR_MEMORY, strf("saved program %s: cannot allocate %" PRId64 " bytes for %s", m.folder.c_str(), expected, name));
    const int64_t got = read_fully(file.fd, into->get(), expected);
    if (got < 0) raise(DISC_ERROR_FILE, strf("saved program %s: cannot read %s (%s)", m.folder.c_str(), name, std::strerror(errno)));
    if (got != expected) damaged(m, name);
    h.update(into->get(), static_cast<size_t>(expected));
  } else {
    std::vector<char> chunk(1 << 20);
    int64_t total = 0;
    for (;;) {
      const int64_t got = read_fully(file.fd, chunk.data(), static_cast<int64_t>(chunk.size()));
      if (got < 0) raise(DISC_ERROR_FILE, strf("saved program %s: cannot read %s (%s)", m.folder.c_str(), name, std::strerror(errno)));
      h.update(chunk.data(), static_cast<size_t>(got));
      total += got;
      if (got < static_cast<int64_t>(chunk.size())) break;
    }
    if (total != expected) damaged(m, name);
  }
  char extra;
  if (into != nullptr && read_fully(file.fd, &extra, 1) != 0) damaged(m, name);
  if (h.hex() != entry->second.second) damaged(m, name);
}

void finish_texts(Tensor& t) {
  t.quoted = repr(t.name);
  t.texts.clear();
  for (const std::string& d : t.dims) t.texts.push_back(d.c_str());
  t.texts.push_back(nullptr);
}

std::unique_ptr<Model> load(const char* folder_arg) {
  if (folder_arg == nullptr || *folder_arg == '\0') raise(DISC_ERROR_FILE, "disc_model_load: no folder given");
  auto model = std::make_unique<Model>();
  Model& m = *model;
  m.folder = folder_arg;
  while (m.folder.size() > 1 && m.folder.back() == '/') m.folder.pop_back();
  const std::string where = m.folder + "/interface.txt";
  parse_interface(read_interface(where, m.folder), where, m.iface);
  Interface& iface = m.iface;
  if (!iface.needs.empty()) {
    std::string reasons;
    for (size_t i = 0; i < iface.needs.size(); ++i) reasons += (i ? "; " : "") + iface.needs[i];
    raise(DISC_ERROR_UNSUPPORTED, "saved program " + m.folder + " cannot run standalone: it needs " + reasons);
  }
  if (iface.abi != DISC_RAL_ABI_VERSION)
    raise(DISC_ERROR_UNSUPPORTED, strf("saved program %s: program.so was generated for RAL ABI %" PRId64 "; this runtime has ABI %d (save it again with this disc)",
                                       m.folder.c_str(), iface.abi, DISC_RAL_ABI_VERSION));
  if (iface.host != host_digest())
    raise(DISC_ERROR_UNSUPPORTED, "saved program " + m.folder + ": program.so was built for another CPU (interface.txt names host " + iface.host.substr(0, 12) +
                                      "..., this machine is " + host_digest().substr(0, 12) + "...); compile and save it on a machine like this one");
  if (iface.files.find("program.so") == iface.files.end()) raise(DISC_ERROR_FILE, where + ": lists no program.so");

  // Constants: at their offsets in one aligned block, as the program's table points into it.
  if (iface.files.find("constants.bin") != iface.files.end()) verify(m, "constants.bin", &m.constants);
  if (!m.constants) {
    m.constants.reset(aligned_block(kAlign));
    if (!m.constants) raise(DISC_ERROR_MEMORY, "disc_model_load: out of memory");
  }
  for (const std::string& a : iface.arguments)
    m.arguments.push_back(const_cast<void*>(m.constant_data(static_cast<int64_t>(iface.constant_index.at(a)))));

  verify(m, "program.so", nullptr);
  const std::string so = m.folder + "/program.so";
  m.library = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (m.library == nullptr) {
    const char* why = dlerror();
    raise(DISC_ERROR_FILE, "saved program " + m.folder + ": program.so cannot be loaded: " + (why ? why : "(no reason given)"));
  }
  auto abi = reinterpret_cast<AbiFn>(dlsym(m.library, "disc_abi_version"));
  m.shapes = reinterpret_cast<ShapesFn>(dlsym(m.library, "disc_shapes"));
  m.run = reinterpret_cast<RunFn>(dlsym(m.library, "disc_run"));
  if (abi == nullptr || m.shapes == nullptr || m.run == nullptr)
    raise(DISC_ERROR_FILE, "saved program " + m.folder + ": program.so is not a disc program (it lacks disc_abi_version, disc_shapes or disc_run)");
  const int32_t program_abi = abi();
  if (program_abi != DISC_RAL_ABI_VERSION)
    raise(DISC_ERROR_UNSUPPORTED, strf("saved program %s: program.so was generated for RAL ABI %d; this runtime has ABI %d", m.folder.c_str(), program_abi, DISC_RAL_ABI_VERSION));
  // The arrays passed to the program are sized from interface.txt: it must describe this program
  // (codegen/cpu/signature.py), or an edited file would have the program read past them.
  auto signature = reinterpret_cast<const char* (*)(void)>(dlsym(m.library, "disc_signature"));
  const std::string stated = signature != nullptr ? signature() : "(none)";
  if (stated != program_signature(iface))
    raise(DISC_ERROR_FILE, "saved program " + m.folder + ": interface.txt does not describe program.so (the program states '" + stated +
                               "'; interface.txt gives '" + program_signature(iface) + "')");

  for (const Tensor& t : iface.inputs) m.input_dims += t.rank();
  for (const auto& b : iface.buffers) {
    m.buffer_start.push_back(m.output_dims);
    m.output_dims += b.second;
  }
  for (Tensor& t : iface.inputs) finish_texts(t);
  for (OutputEntry& o : iface.outputs) finish_texts(o.spec);
  if (!m.arguments.empty()) {
    disc_ral_cpu_hold_constants(const_cast<const void* const*>(m.arguments.data()), static_cast<int64_t>(m.arguments.size()), 1);
    m.held = true;
  }
  return model;
}

// ---------------------------------------------------------------------------------------------
// Calls

std::string type_text(const Tensor& t) {  // as the IR prints a type: f32[b, s, 5]
  std::string out = std::string(kDtypeNames[t.dtype]) + "[";
  for (size_t i = 0; i < t.dims.size(); ++i) out += (i ? ", " : "") + t.dims[i];
  return out + "]";
}

// checks.py's InputChecker._check with the same messages, then the C caller's own mistakes (a
// negative dim, null data). Fills `dims`, every input's dims concatenated.
void check_inputs(const Model& m, const disc_tensor* inputs, int32_t n, bool need_data, std::vector<int64_t>& dims) {
  const Interface& iface = m.iface;
  const int32_t expected = static_cast<int32_t>(iface.inputs.size());
  if (n != expected) {
    std::string names = "[";
    for (int32_t i = 0; i < expected; ++i) names += (i ? ", " : "") + repr(iface.inputs[static_cast<size_t>(i)].name);
    raise(DISC_ERROR_INPUT, strf("expected %d input(s) %s], got %d", expected, names.c_str(), n));
  }
  if (inputs == nullptr && n > 0) raise(DISC_ERROR_INPUT, "the inputs array is null");
  struct Seen {
    int64_t value = 0;
    int32_t input = -1, axis = 0;
  };
  Seen seen_small[8];
  std::vector<Seen> seen_large;
  Seen* seen = seen_small;
  if (iface.symbols.size() > 8) {
    seen_large.resize(iface.symbols.size());
    seen = seen_large.data();
  }
  dims.assign(static_cast<size_t>(std::max<int64_t>(m.input_dims, 1)), 0);
  size_t pos = 0;
  for (int32_t i = 0; i < n; ++i) {
    const Tensor& spec = iface.inputs[static_cast<size_t>(i)];
    const disc_tensor& t = inputs[i];
    const char* quoted = spec.quoted.c_str();
    if (t.dtype != spec.dtype) {
      const std::string got = known_dtype(t.dtype) ? kDtypeNames[t.dtype] : strf("%d (no disc dtype)", t.dtype);
      raise(DISC_ERROR_INPUT, strf("input %s has dtype %s, compiled for %s", quoted, got.c_str(), kDtypeNames[spec.dtype]));
    }
    if (t.rank != spec.rank()) {
      if (t.rank < 0 || t.rank > DISC_MAX_RANK)
        raise(DISC_ERROR_INPUT, strf("input %s has rank %d, compiled for rank %d", quoted, t.rank, spec.rank()));
      raise(DISC_ERROR_INPUT, strf("input %s has rank %d (shape %s), compiled for rank %d %s", quoted, t.rank, shape_text(t.shape, t.rank).c_str(), spec.rank(),
                                   type_text(spec).c_str()));
    }
    for (int32_t axis = 0; axis < t.rank; ++axis) {
      const int64_t size = t.shape[axis];
      dims[pos++] = size;
      if (size < 0) raise(DISC_ERROR_INPUT, strf("input %s dim %d is %" PRId64 ", a negative size", quoted, axis, size));
      const Dim& d = spec.parsed[static_cast<size_t>(axis)];
      if (d.kind == kStatic) {
        if (size != d.value)
          raise(DISC_ERROR_SHAPE, strf("input %s dim %d is %" PRId64 " but must be %" PRId64 " (a static dim of the compiled program)", quoted, axis, size, d.value));
        continue;
      }
      if (d.kind == kComputed) continue;  // an expression of other dims: the program checks it
      Seen& s = seen[d.symbol];
      if (s.input >= 0) {
        if (s.value != size)
          raise(DISC_ERROR_SHAPE, strf("input %s dim %d is %" PRId64 " but must equal input %s dim %d (%" PRId64 ")", quoted, axis, size,
                                       repr(iface.inputs[static_cast<size_t>(s.input)].name).c_str(), s.axis, s.value));
        continue;
      }
      s = Seen{size, i, axis};
      const SymbolRule& rule = iface.symbols[static_cast<size_t>(d.symbol)];
      if (size < rule.lo || (rule.hi >= 0 && size > rule.hi)) {
        const std::string hi = rule.hi >= 0 ? std::to_string(rule.hi) : "inf";
        raise(DISC_ERROR_SHAPE, strf("input %s dim %d is %" PRId64 " but %s must be in [%" PRId64 ", %s]", quoted, axis, size, rule.name.c_str(), rule.lo, hi.c_str()));
      }
      if (rule.divisor > 1 && size % rule.divisor != 0)
        raise(DISC_ERROR_SHAPE, strf("input %s dim %d is %" PRId64 " but %s must be a multiple of %" PRId64, quoted, axis, size, rule.name.c_str(), rule.divisor));
    }
    const int64_t bytes = byte_size(t.shape, t.rank, t.dtype);
    if (bytes < 0) raise(DISC_ERROR_INPUT, strf("input %s has shape %s, more bytes than memory can hold", quoted, shape_text(t.shape, t.rank).c_str()));
    if (need_data && bytes > 0 && t.data == nullptr)
      raise(DISC_ERROR_INPUT, strf("input %s has shape %s but its data is null", quoted, shape_text(t.shape, t.rank).c_str()));
  }
}

// The program's output dims and workspace size for these input dims (`disc_shapes`).
int64_t plan(const Model& m, const std::vector<int64_t>& dims, std::vector<int64_t>& out_dims) {
  out_dims.assign(static_cast<size_t>(std::max<int64_t>(m.output_dims, 1)), 0);
  disc_ral_ctx ctx;
  std::memset(&ctx, 0, sizeof ctx);
  int64_t ws = 0;
  const int32_t rc = m.shapes(dims.data(), out_dims.data(), &ws, &ctx);
  if (rc != 0) {
    const std::string message(ctx.error, strnlen(ctx.error, sizeof ctx.error));
    raise(rc == 2 ? DISC_ERROR_SHAPE : DISC_ERROR_RUN, message.empty() ? strf("disc_shapes of %s failed (code %d)", m.folder.c_str(), rc) : message);
  }
  if (ws < 0) raise(DISC_ERROR_RUN, strf("disc_shapes of %s gave a negative workspace size", m.folder.c_str()));
  return ws;
}

struct Shape {
  int32_t dtype = 0, rank = 0;
  int64_t dims[DISC_MAX_RANK] = {};
  int64_t bytes = 0;
};

// Every graph output's dtype, rank and shape, its buffers' dims taken from `buffer_dims`.
void output_shapes(const Model& m, const disc_tensor* inputs, const int64_t* buffer_dims, std::vector<Shape>& out) {
  const Interface& iface = m.iface;
  out.assign(iface.outputs.size(), Shape{});
  for (size_t k = 0; k < iface.outputs.size(); ++k) {
    const OutputEntry& o = iface.outputs[k];
    Shape& s = out[k];
    const auto where = static_cast<size_t>(o.where);
    s.dtype = o.spec.dtype;
    s.rank = o.spec.rank();
    if (o.kind == kBuffer) {
      std::memcpy(s.dims, buffer_dims + m.buffer_start[where], sizeof(int64_t) * static_cast<size_t>(s.rank));
    } else if (o.kind == kInput) {
      std::memcpy(s.dims, inputs[where].shape, sizeof(int64_t) * static_cast<size_t>(s.rank));
    } else if (o.kind == kConstant) {
      for (int32_t a = 0; a < s.rank; ++a) s.dims[a] = iface.constants[where].spec.parsed[static_cast<size_t>(a)].value;
    } else {
      s = out[where];
    }
    s.bytes = byte_size(s.dims, s.rank, s.dtype);
    if (s.bytes < 0) raise(DISC_ERROR_RUN, strf("%s: program.so gave output %zu the shape %s", m.folder.c_str(), k, shape_text(s.dims, s.rank).c_str()));
  }
}

void check_outputs_arg(const Model& m, const disc_tensor* outputs, int32_t n) {
  const auto expected = static_cast<int32_t>(m.iface.outputs.size());
  if (n != expected) raise(DISC_ERROR_INPUT, strf("expected %d output(s), got %d", expected, n));
  if (outputs == nullptr && n > 0) raise(DISC_ERROR_INPUT, "the outputs array is null");
}

void describe(disc_tensor& t, const Shape& s) {
  t.dtype = s.dtype;
  t.rank = s.rank;
  std::memcpy(t.shape, s.dims, sizeof t.shape);
}

void output_shapes_call(const Model& m, const disc_tensor* inputs, int32_t num_inputs, disc_tensor* outputs, int32_t num_outputs) {
  std::vector<int64_t> dims, out_dims;
  check_inputs(m, inputs, num_inputs, false, dims);
  check_outputs_arg(m, outputs, num_outputs);
  plan(m, dims, out_dims);
  std::vector<Shape> shapes;
  output_shapes(m, inputs, out_dims.data(), shapes);
  for (size_t k = 0; k < shapes.size(); ++k) describe(outputs[k], shapes[k]);
}

void run_call(const Model& m, const disc_tensor* inputs, int32_t num_inputs, disc_tensor* outputs, int32_t num_outputs) {
  const Interface& iface = m.iface;
  std::vector<int64_t> dims, out_dims;
  check_inputs(m, inputs, num_inputs, true, dims);
  check_outputs_arg(m, outputs, num_outputs);
  const int64_t ws_bytes = plan(m, dims, out_dims);
  std::vector<Shape> planned;
  output_shapes(m, inputs, out_dims.data(), planned);

  // Where each buffer goes: a caller's output buffer, else a block that becomes the first output
  // naming it (or scratch when none does). Every other output is a copy into its own memory.
  const size_t nb = iface.buffers.size(), no = iface.outputs.size();
  std::vector<void*> buffer(nb, nullptr), dest(no, nullptr);
  std::vector<Block> blocks(no);        // what the runtime allocated for output k
  std::vector<Block> scratch;           // buffers no output names
  std::vector<int32_t> owner(nb, -1);   // the output each buffer is written for
  for (size_t k = 0; k < no; ++k) {
    const OutputEntry& o = iface.outputs[k];
    if (o.kind == kBuffer && outputs[k].data != nullptr && owner[static_cast<size_t>(o.where)] < 0) {
      owner[static_cast<size_t>(o.where)] = static_cast<int32_t>(k);
      buffer[static_cast<size_t>(o.where)] = dest[k] = outputs[k].data;
    }
  }
  for (size_t k = 0; k < no; ++k) {
    const OutputEntry& o = iface.outputs[k];
    if (o.kind == kBuffer && owner[static_cast<size_t>(o.where)] < 0) owner[static_cast<size_t>(o.where)] = static_cast<int32_t>(k);
    if (dest[k] != nullptr) continue;
    if (outputs[k].data != nullptr) {
      dest[k] = outputs[k].data;
      continue;
    }
    blocks[k].reset(aligned_block(planned[k].bytes));
    if (!blocks[k]) raise(DISC_ERROR_MEMORY, strf("cannot allocate %" PRId64 " bytes for output %zu", planned[k].bytes, k));
    dest[k] = blocks[k].get();
    if (o.kind == kBuffer && owner[static_cast<size_t>(o.where)] == static_cast<int32_t>(k)) buffer[static_cast<size_t>(o.where)] = dest[k];
  }
  for (size_t b = 0; b < nb; ++b) {
    if (buffer[b] != nullptr) continue;
    const int64_t bytes = byte_size(out_dims.data() + m.buffer_start[b], static_cast<int32_t>(iface.buffers[b].second), iface.buffers[b].first);
    if (bytes < 0) raise(DISC_ERROR_RUN, strf("%s: program.so gave buffer %zu a negative or overflowing shape", m.folder.c_str(), b));
    scratch.emplace_back(aligned_block(bytes));
    if (!scratch.back()) raise(DISC_ERROR_MEMORY, strf("cannot allocate %" PRId64 " bytes for output buffer %zu", bytes, b));
    buffer[b] = scratch.back().get();
  }

  std::vector<void*> input_data(static_cast<size_t>(std::max(num_inputs, 1)), nullptr);
  for (int32_t i = 0; i < num_inputs; ++i) input_data[static_cast<size_t>(i)] = inputs[i].data;
  if (buffer.empty()) buffer.push_back(nullptr);
  std::vector<int64_t> actual;
  if (iface.data_dependent) actual = out_dims;
  void* workspace = tls_workspace.at_least(ws_bytes);
  disc_ral_ctx ctx;
  std::memset(&ctx, 0, sizeof ctx);
  const int32_t rc = m.run(disc_ral_cpu(), &ctx, dims.data(), input_data.data(), m.arguments.empty() ? nullptr : m.arguments.data(), buffer.data(), workspace,
                           iface.data_dependent ? actual.data() : nullptr);
  if (rc != 0) {
    const std::string message(ctx.error, strnlen(ctx.error, sizeof ctx.error));
    raise(DISC_ERROR_RUN, message.empty() ? strf("program.so of %s failed (code %d)", m.folder.c_str(), rc) : message);
  }

  // A data-dependent buffer holds its elements at the dims it ran at, from its start.
  std::vector<Shape> final_shapes;
  if (iface.data_dependent) {
    output_shapes(m, inputs, actual.data(), final_shapes);
    for (size_t k = 0; k < no; ++k)
      if (final_shapes[k].bytes > planned[k].bytes)
        raise(DISC_ERROR_RUN, strf("%s: program.so ran output %zu at %s, beyond its planned %s", m.folder.c_str(), k, shape_text(final_shapes[k].dims, final_shapes[k].rank).c_str(),
                                   shape_text(planned[k].dims, planned[k].rank).c_str()));
  }
  const std::vector<Shape>& shapes = iface.data_dependent ? final_shapes : planned;
  for (size_t k = 0; k < no; ++k) {
    const OutputEntry& o = iface.outputs[k];
    const auto where = static_cast<size_t>(o.where);
    const void* source = o.kind == kBuffer ? buffer[where] : o.kind == kInput ? inputs[where].data : o.kind == kConstant ? m.constant_data(o.where) : dest[where];
    if (source != dest[k] && shapes[k].bytes > 0) std::memcpy(dest[k], source, static_cast<size_t>(shapes[k].bytes));
  }
  for (size_t k = 0; k < no; ++k) {
    describe(outputs[k], shapes[k]);
    if (blocks[k]) outputs[k].data = blocks[k].release();
  }
}

// disc_runtime.h's opaque `disc_model` is never defined: a handle is a Model's address.
const Model* model_of(const disc_model* m) { return reinterpret_cast<const Model*>(m); }

int32_t tensor_info(const Tensor& t, disc_tensor_info* info) {
  if (info == nullptr) return DISC_ERROR_INPUT;
  info->name = t.name.c_str();
  info->dtype = t.dtype;
  info->rank = t.rank();
  info->dims = t.texts.data();
  return DISC_OK;
}

}  // namespace disc_standalone

#pragma GCC visibility pop

using disc_standalone::model_of;
using disc_standalone::tensor_info;

#define DISC_EXPORT extern "C" __attribute__((visibility("default")))

DISC_EXPORT disc_model* disc_model_load(const char* folder, disc_error* error) {
  disc_model* handle = nullptr;
  disc_standalone::guarded(error, [&] {
    handle = reinterpret_cast<disc_model*>(disc_standalone::load(folder).release());
  });
  return handle;
}

DISC_EXPORT void disc_model_free(disc_model* model) { delete reinterpret_cast<disc_standalone::Model*>(model); }

DISC_EXPORT const char* disc_model_name(const disc_model* model) {
  const disc_standalone::Model* m = model_of(model);
  return m != nullptr ? m->iface.name.c_str() : "";
}

DISC_EXPORT int32_t disc_model_num_inputs(const disc_model* model) {
  const disc_standalone::Model* m = model_of(model);
  return m != nullptr ? static_cast<int32_t>(m->iface.inputs.size()) : 0;
}

DISC_EXPORT int32_t disc_model_num_outputs(const disc_model* model) {
  const disc_standalone::Model* m = model_of(model);
  return m != nullptr ? static_cast<int32_t>(m->iface.outputs.size()) : 0;
}

DISC_EXPORT int32_t disc_model_input_info(const disc_model* model, int32_t index, disc_tensor_info* info) {
  const disc_standalone::Model* m = model_of(model);
  if (m == nullptr || index < 0 || static_cast<size_t>(index) >= m->iface.inputs.size()) return DISC_ERROR_INPUT;
  return tensor_info(m->iface.inputs[static_cast<size_t>(index)], info);
}

DISC_EXPORT int32_t disc_model_output_info(const disc_model* model, int32_t index, disc_tensor_info* info) {
  const disc_standalone::Model* m = model_of(model);
  if (m == nullptr || index < 0 || static_cast<size_t>(index) >= m->iface.outputs.size()) return DISC_ERROR_INPUT;
  return tensor_info(m->iface.outputs[static_cast<size_t>(index)].spec, info);
}

DISC_EXPORT int32_t disc_model_output_shapes(const disc_model* model, const disc_tensor* inputs, int32_t num_inputs, disc_tensor* outputs, int32_t num_outputs,
                                             disc_error* error) {
  return disc_standalone::guarded(error, [&] {
    const disc_standalone::Model* m = model_of(model);
    if (m == nullptr) disc_standalone::raise(DISC_ERROR_INPUT, "disc_model_output_shapes: the model is null");
    disc_standalone::output_shapes_call(*m, inputs, num_inputs, outputs, num_outputs);
  });
}

DISC_EXPORT int32_t disc_model_run(const disc_model* model, const disc_tensor* inputs, int32_t num_inputs, disc_tensor* outputs, int32_t num_outputs, disc_error* error) {
  return disc_standalone::guarded(error, [&] {
    const disc_standalone::Model* m = model_of(model);
    if (m == nullptr) disc_standalone::raise(DISC_ERROR_INPUT, "disc_model_run: the model is null");
    disc_standalone::run_call(*m, inputs, num_inputs, outputs, num_outputs);
  });
}

DISC_EXPORT void disc_free(void* data) { std::free(data); }

DISC_EXPORT size_t disc_dtype_size(int32_t dtype) { return disc_standalone::known_dtype(dtype) ? disc_standalone::kDtypeSizes[dtype] : 0; }

DISC_EXPORT const char* disc_dtype_name(int32_t dtype) { return disc_standalone::known_dtype(dtype) ? disc_standalone::kDtypeNames[dtype] : "?"; }

#undef DISC_EXPORT
