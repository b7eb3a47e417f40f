#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"

namespace shardlm::io {

namespace {

Error errno_error(const std::string& what, const std::string& path, int err) {
  return Error(fmt::format("{}: {}", what, std::strerror(err))).set_file(path);
}

// fsync the directory holding `path` so the rename itself survives a crash.
void fsync_parent_dir(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  fsync_dir(dir.empty() ? "." : dir.string());
}

std::string temp_path_name(const std::string& path) {
  return std::filesystem::path(fmt::format("{}.tmp.{}", path, ::getpid())).filename().string();
}

}  // namespace

void fsync_dir(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw errno_error("cannot open directory to sync it", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL) throw errno_error("cannot sync directory", dir, err);
}

void write_all(int fd, const void* data, size_t n, const std::string& path_for_errors) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw errno_error("write failed", path_for_errors, errno);
    }
    p += w;
    n -= size_t(w);
  }
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_path_ = fmt::format("{}.tmp.{}", path_, ::getpid());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int err = errno;
    temp_path_.clear();  // nothing to remove
    throw errno_error(fmt::format("cannot create temporary file {}", temp_path_name(path_)), path_, err);
  }
}

AtomicFile::~AtomicFile() { abandon(); }

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)), temp_path_(std::exchange(o.temp_path_, {})), fd_(std::exchange(o.fd_, -1)) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this != &o) {
    abandon();
    path_ = std::move(o.path_);
    temp_path_ = std::exchange(o.temp_path_, {});
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void AtomicFile::write(const void* data, size_t n) {
  SHARDLM_CHECK(fd_ >= 0, "write to {} after commit or abandon", path_);
  write_all(fd_, data, n, temp_path_);
}

void AtomicFile::pwrite(const void* data, size_t n, uint64_t offset) {
  SHARDLM_CHECK(fd_ >= 0, "write to {} after commit or abandon", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw errno_error("write failed", temp_path_, errno);
    }
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
}

void AtomicFile::seal() {
  SHARDLM_CHECK(fd_ >= 0, "seal of {} after seal, commit or abandon", path_);
  // On any failure below the destructor (or abandon) still removes the temporary file.
  if (::fsync(fd_) != 0) throw errno_error("cannot sync file", temp_path_, errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    throw errno_error("cannot close file", temp_path_, err);
  }
}

void AtomicFile::commit() {
  SHARDLM_CHECK(!temp_path_.empty(), "commit of {} after commit or abandon", path_);
  if (fd_ >= 0) seal();
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    throw errno_error(fmt::format("cannot rename {} over it", temp_path_), path_, err);
  }
  temp_path_.clear();  // nothing left to clean up
  fsync_parent_dir(path_);
}

void AtomicFile::abandon() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_path_.clear();
  }
}

void write_file_atomic(const std::string& path, const std::function<void(int fd)>& writer) {
  AtomicFile f(path);
  writer(f.fd());  // if this throws, ~AtomicFile removes the temporary file
  f.commit();
}

void write_text_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace shardlm::io
