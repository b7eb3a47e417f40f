// Crash-safe file replacement: write a temporary file next to the target, fsync it, rename it
// over the target, fsync the directory.
//
// A reader of `path` therefore sees either the complete old file or the complete new one, never a
// torn mix, even if the process dies or the machine loses power mid-write. The temporary file is
// "<path>.tmp.<pid>" in the same directory (rename is only atomic within one filesystem). If the
// write is abandoned (an exception, or an AtomicFile destroyed without commit()), the temporary
// file is removed and whatever was at `path` before is left untouched.
//
// Every failure is an Error naming the path and the errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace shardlm::io {

class AtomicFile {
 public:
  // Creates (truncates) the temporary file "<path>.tmp.<pid>" for writing.
  explicit AtomicFile(std::string path);
  // Without a successful commit(): closes and removes the temporary file.
  ~AtomicFile();
  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&& o) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }            // the final path
  const std::string& temp_path() const { return temp_path_; }  // where the bytes go until commit()
  int fd() const { return fd_; }                                // -1 after seal(), commit() or abandon()

  // Append all n bytes at the current position (retries short writes and EINTR).
  void write(const void* data, size_t n);
  // Write all n bytes at absolute offset `offset`, leaving the current position alone.
  void pwrite(const void* data, size_t n, uint64_t offset);

  // fsync and close the temporary file without publishing it; a later commit() only renames it.
  // This lets a caller write many files and then publish them together (io/model_files.cpp):
  // a sealed file holds no descriptor, so any number of them can wait.
  void seal();
  // fsync, close, rename over path(), fsync the directory (whatever seal() has not done yet).
  // After this the object is inert.
  void commit();
  // Close and remove the temporary file now (what the destructor does). Never throws.
  void abandon() noexcept;

 private:
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
};

// Write `path` atomically: `writer` fills the temporary file through the given descriptor
// (with ::write, or write_all below); then it is committed. If `writer` throws, the temporary
// file is removed, the previous file at `path` (if any) is kept, and the exception propagates.
void write_file_atomic(const std::string& path, const std::function<void(int fd)>& writer);
// write_file_atomic with a whole string as the content.
void write_text_atomic(const std::string& path, const std::string& text);

// fsync the directory `dir`, so that the renames inside it survive a crash (a filesystem that
// cannot sync directories, EINVAL, is let be: the renames have still happened).
void fsync_dir(const std::string& dir);

// Write all n bytes to fd, retrying short writes and EINTR; errors name `path_for_errors`.
void write_all(int fd, const void* data, size_t n, const std::string& path_for_errors);

}  // namespace shardlm::io
