#include "io/staged_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>  // renameat2 (glibc 2.28)
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"

namespace shardlm::io {

namespace fs = std::filesystem;

namespace {

// What a model, adapter or tokenizer directory holds; anything else in a target means it is not
// only ours to delete.
bool is_model_dir_file(const fs::directory_entry& e) {
  std::error_code ec;
  if (!e.is_regular_file(ec)) return false;
  const std::string ext = e.path().extension().string();
  return ext == ".safetensors" || ext == ".json" || ext == ".model" || ext == ".bin" || ext == ".md" ||
         ext == ".txt";
}

void remove_quietly(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::string parent_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace

void check_publishable(const std::string& target, Publish publish, const std::string& role) {
  std::error_code ec;
  if (!fs::exists(target, ec)) return;
  if (!fs::is_directory(target, ec)) throw Error(fmt::format("{} exists and is not a directory", role)).set_file(target);
  if (publish == Publish::ReplaceAnything || publish == Publish::InPlace) return;
  for (const fs::directory_entry& e : fs::directory_iterator(target, ec)) {
    if (publish == Publish::New)
      throw Error(fmt::format("{} exists and is not empty (it holds '{}'); refusing to replace it",
                              role, e.path().filename().string()))
          .set_file(target);
    if (!is_model_dir_file(e))
      throw Error(fmt::format("{} already holds '{}', which is not a model file; refusing to replace the directory "
                              "(choose a new or empty one)",
                              role, e.path().filename().string()))
          .set_file(target);
  }
  if (ec) throw Error(fmt::format("cannot list {}: {}", role, ec.message())).set_file(target);
}

StagedDir::StagedDir(std::string target, Publish publish, const std::string& role) : target_(std::move(target)) {
  SHARDLM_CHECK(publish != Publish::InPlace, "StagedDir for {}: an in-place publish is not staged", target_);
  // "out/" and "out" are one target; the staging directory must be its sibling, not its child.
  while (target_.size() > 1 && target_.back() == '/') target_.pop_back();
  check_publishable(target_, publish, role);
  std::error_code ec;
  fs::create_directories(parent_of(target_), ec);
  if (ec) throw Error(fmt::format("cannot create the parent of {}: {}", role, ec.message())).set_file(target_);
  staging_ = fmt::format("{}.tmp.{}", target_, ::getpid());
  remove_quietly(staging_);  // left by a dead process that had this pid
  fs::create_directory(staging_, ec);
  if (ec) throw Error(fmt::format("cannot create a staging directory for {}: {}", role, ec.message())).set_file(staging_);
}

StagedDir::~StagedDir() {
  if (!staging_.empty()) remove_quietly(staging_);
}

void StagedDir::commit() {
  SHARDLM_CHECK(!staging_.empty(), "StagedDir {} committed twice", target_);
  // The files themselves were synced as they were written (io/atomic_file.h); the directory
  // holding them is synced here, then the one the rename changes.
  std::error_code ec;
  fsync_dir(staging_);

  if (!fs::exists(target_, ec)) {
    if (::rename(staging_.c_str(), target_.c_str()) != 0)
      throw Error(fmt::format("cannot publish {} as it: {}", staging_, std::strerror(errno))).set_file(target_);
  } else if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    // The staging name now holds the old directory.
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    // No exchange on this filesystem: move the old one aside, then the new one in.
    const std::string old = fmt::format("{}.old.{}", target_, ::getpid());
    remove_quietly(old);
    if (::rename(target_.c_str(), old.c_str()) != 0)
      throw Error(fmt::format("cannot move the old directory aside: {}", std::strerror(errno))).set_file(target_);
    if (::rename(staging_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      ::rename(old.c_str(), target_.c_str());  // put the old one back
      throw Error(fmt::format("cannot publish {} as it: {}", staging_, std::strerror(err))).set_file(target_);
    }
    staging_ = old;
  } else {
    throw Error(fmt::format("cannot swap {} into place: {}", staging_, std::strerror(errno))).set_file(target_);
  }
  fsync_dir(parent_of(target_));
  const std::string old = std::exchange(staging_, "");
  if (fs::exists(old, ec)) remove_quietly(old);  // the replaced directory, after the swap
}

void publish_dir(const std::string& target, Publish publish, const std::string& role,
                 const std::function<void(const std::string& dir)>& write) {
  if (publish == Publish::InPlace) {
    write(target);
    return;
  }
  StagedDir staged(target, publish, role);
  write(staged.path());
  staged.commit();
}

void refuse_output_over_input(const std::string& output, const std::string& output_role, const std::string& input,
                              const std::string& input_role) {
  if (output.empty() || input.empty()) return;
  auto resolved = [](const std::string& p) {
    std::error_code ec;
    fs::path r = fs::weakly_canonical(fs::absolute(p), ec).lexically_normal();
    if (r.has_parent_path() && r.filename().empty()) r = r.parent_path();  // "dir/" is "dir"
    return r;
  };
  if (resolved(output) != resolved(input)) return;
  throw Error(fmt::format("{} is the {} it reads ({}): writing there would overwrite its input; choose another "
                          "path",
                          output_role, input_role, input))
      .set_file(output);
}

}  // namespace shardlm::io
