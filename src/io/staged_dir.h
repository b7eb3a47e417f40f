// A directory that appears whole or not at all: a model, merged model or adapter written by
// convert, merge, init, export and the trainer's adapter/merged outputs.
//
// Its files are written into a sibling staging directory "<target>.tmp.<pid>" (same filesystem,
// so a rename can move it), synced, and published by one rename. When the target already exists
// the two are swapped atomically (renameat2 RENAME_EXCHANGE) and the old one removed afterwards,
// so a reader of the target, or a crash at any moment, sees the complete old directory or the
// complete new one. Filesystems without the exchange (some network ones) fall back to two
// renames, with a moment where the target is absent, but never a mix.
//
// Replacing is the dangerous part: the old directory is deleted whole. So what an existing target
// may hold is the caller's choice (Publish below); otherwise the constructor throws an Error naming
// the target and the first entry in the way, before anything is written.
//
// Ownership: the object owns the staging directory until commit(); destroyed without a commit
// (an exception while writing), it removes it and the target is untouched.
#pragma once

#include <functional>
#include <string>

namespace shardlm::io {

// How a model directory is published, and what an existing target may hold.
enum class Publish {
  New,              // staged and swapped in whole; an existing target must be empty
  Replace,          // the same, and a target holding only model files (named as model, adapter,
                    // config and tokenizer files are) is replaced
  ReplaceAnything,  // the same, whatever the target held (the user forced it: init --force)
  InPlace,          // files written into a directory that holds other things too (the trainer's
                    // output_dir, beside its checkpoints and metrics): each file atomic, the shards
                    // of a save tied together by a save id (io/model_files.h)
};

// Throws the Error the StagedDir constructor would (see above) when `target` may not be published
// under `publish`: for refusing before a long computation. Nothing is created.
void check_publishable(const std::string& target, Publish publish, const std::string& role);

class StagedDir {
 public:
  // `role` names the target in errors ("--out", "output_dir/adapter" ...). `publish` is not InPlace.
  StagedDir(std::string target, Publish publish, const std::string& role);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  // Where the files go until commit(): an empty directory, created by the constructor.
  const std::string& path() const { return staging_; }
  const std::string& target() const { return target_; }

  // Syncs the staging directory, then publishes it as the target (see the top). Its files must be
  // written through io/atomic_file.h, which syncs each one (every model-directory writer does).
  void commit();

 private:
  std::string target_;
  std::string staging_;  // empty once committed
};

// The one way a model directory is written: write(dir) fills `dir` (the staging directory, or the
// target itself for InPlace), then it is published as `target`. `role` names the target in errors.
void publish_dir(const std::string& target, Publish publish, const std::string& role,
                 const std::function<void(const std::string& dir)>& write);

// Throws an Error naming `output_role` and `input_role` when the output directory `output` is the
// directory `input` (after resolving symlinks and relative paths), whose files the output would
// overwrite while they are being read. Paths that do not exist yet are compared lexically.
void refuse_output_over_input(const std::string& output, const std::string& output_role, const std::string& input,
                              const std::string& input_role);

}  // namespace shardlm::io
