// An exclusive lock on a directory for as long as this object lives: two runs writing one
// output_dir at once would truncate each other's metrics and replace each other's model.
//
// It is an flock(2) on "<dir>/.shardlm.lock", which names its holder (pid, host, start time) so
// that the refused run can say who holds it. The kernel drops an flock when its holder dies, so a
// killed run never leaves a stale lock; the file itself stays behind, harmlessly. flock works on
// local filesystems and on NFSv4 (where Linux maps it to a byte-range lock).
//
// Ownership: the object owns the descriptor that holds the lock; moving it moves the lock.
#pragma once

#include <string>

namespace shardlm::io {

inline constexpr const char* kDirLockName = ".shardlm.lock";

class DirLock {
 public:
  DirLock() = default;
  // Creates `dir` if missing and takes the lock, or throws an Error naming the directory, `role`
  // and the holder ("in use by pid 123 on host node1, since 2026-11-25 21:58:03 UTC").
  DirLock(const std::string& dir, const std::string& role);
  ~DirLock();
  DirLock(DirLock&& o) noexcept;
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace shardlm::io
