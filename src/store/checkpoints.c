// SPDX-License-Identifier: Apache-2.0
// store: checkpoint files (rename into place, fsync file and directory) and
// their index.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <sqlite3.h>

#include "store/store_impl.h"

void pcp_store_checkpoint_list_deinitialize(pcp_store_checkpoint_list_t* list) {
  if (list->items) {
    pcp_allocator_free(list->allocator, list->items);
  }
  memset(list, 0, sizeof(*list));
}

static pcp_status_t write_all(int fd, const void* data, size_t byte_length,
                              const char* path) {
  const uint8_t* cursor = data;
  while (byte_length > 0) {
    ssize_t n = write(fd, cursor, byte_length);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return pcp_status_from_errno(errno, "writing %s", path);
    }
    cursor += n;
    byte_length -= (size_t)n;
  }
  return pcp_ok_status();
}

static pcp_status_t fsync_path(const char* path, int flags) {
  int fd = open(path, flags | O_CLOEXEC);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "opening %s for fsync", path);
  }
  pcp_status_t status = pcp_ok_status();
  if (fsync(fd) != 0) {
    status = pcp_status_from_errno(errno, "fsync %s", path);
  }
  close(fd);
  return status;
}

// Writes |data| to |temp_path| and fsyncs it (no lock held: the bytes may be
// large).
static pcp_status_t temp_file_write(const char* temp_path, const void* data,
                                    size_t byte_length) {
  int fd = open(temp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "creating %s", temp_path);
  }
  pcp_status_t status = write_all(fd, data, byte_length, temp_path);
  if (!status && fsync(fd) != 0) {
    status = pcp_status_from_errno(errno, "fsync %s", temp_path);
  }
  if (close(fd) != 0 && !status) {
    status = pcp_status_from_errno(errno, "closing %s", temp_path);
  }
  if (status) {
    unlink(temp_path);
  }
  return status;
}

static pcp_status_t checkpoint_exists_locked(pcp_store_t* store,
                                             const char* job_id, int64_t step,
                                             bool* out_exists) {
  *out_exists = false;
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_CHECKPOINT_GET,
      "SELECT job_id, step, path, sha256, byte_length, created_at_ns"
      " FROM checkpoints WHERE job_id = ?1 AND step = ?2",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, job_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 2, step);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  int rc = sqlite3_step(stmt);
  pcp_status_t status = pcp_ok_status();
  if (rc == SQLITE_ROW) {
    *out_exists = true;
  } else if (rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "checkpoint get");
  }
  sqlite3_reset(stmt);
  return status;
}

static pcp_status_t checkpoint_index_locked(
    pcp_store_t* store, const char* job_id, int64_t step,
    const char* relative_path, const char* hex, uint64_t byte_length,
    int64_t now_ns, int64_t* out_event_id) {
  sqlite3_stmt* stmt = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_CHECKPOINT_INSERT,
      "INSERT INTO checkpoints(job_id, step, path, sha256, byte_length,"
      " created_at_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
      &stmt));
  int brc = sqlite3_bind_text(stmt, 1, job_id, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 2, step);
  brc |= sqlite3_bind_text(stmt, 3, relative_path, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_text(stmt, 4, hex, -1, SQLITE_TRANSIENT);
  brc |= sqlite3_bind_int64(stmt, 5, (int64_t)byte_length);
  brc |= sqlite3_bind_int64(stmt, 6, now_ns);
  PCP_RETURN_IF_ERROR_BARE(pcp_store_bind_check(store, brc));
  PCP_RETURN_IF_ERROR_BARE(
      pcp_store_stmt_run(store, stmt, "checkpoint insert"));
  json_t* payload =
      json_pack("{s:s, s:s, s:I}", "path", relative_path, "sha256", hex,
                "byte_length", (json_int_t)byte_length);
  if (!payload) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory building a checkpoint event");
  }
  pcp_status_t status = pcp_store_job_step_commit_locked(
      store, job_id, step, "checkpoint", payload, out_event_id);
  json_decref(payload);
  return status;
}

// Steps 2 and 3 of pcp_store_checkpoint_write, under the store lock: the
// existence check, the rename and the commit happen without another writer
// in between, so an indexed file is never renamed over.
static pcp_status_t checkpoint_publish_locked(
    pcp_store_t* store, const char* job_id, int64_t step, const char* temp_path,
    const char* final_path, const char* dir_path, const char* relative_path,
    const char* hex, uint64_t byte_length, int64_t now_ns,
    int64_t* out_event_id) {
  bool exists = false;
  PCP_RETURN_IF_ERROR_BARE(
      checkpoint_exists_locked(store, job_id, step, &exists));
  if (exists) {
    return pcp_make_status(PCP_STATUS_ALREADY_EXISTS,
                           "job '%s' already has a checkpoint at step %lld",
                           job_id, (long long)step);
  }
  if (rename(temp_path, final_path) != 0) {
    return pcp_status_from_errno(errno, "renaming %s to %s", temp_path,
                                 final_path);
  }
  // The rename is durable only once the directory entry is.
  PCP_RETURN_IF_ERROR_BARE(fsync_path(dir_path, O_RDONLY | O_DIRECTORY));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_tx_begin(store));
  return pcp_store_tx_finish(
      store, checkpoint_index_locked(store, job_id, step, relative_path, hex,
                                     byte_length, now_ns, out_event_id));
}

pcp_status_t pcp_store_checkpoint_write(
    pcp_store_t* store, const char* job_id, int64_t step, const void* data,
    size_t byte_length, pcp_store_checkpoint_t* out_checkpoint) {
  if (out_checkpoint) {
    memset(out_checkpoint, 0, sizeof(*out_checkpoint));
  }
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", job_id, false));
  if (step < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "checkpoint step %lld is negative", (long long)step);
  }
  if ((uint64_t)byte_length > PCP_STORE_CHECKPOINT_MAX_BYTE_LENGTH ||
      (!data && byte_length)) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT,
        "checkpoint of %zu bytes (max %llu, data %s)", byte_length,
        (unsigned long long)PCP_STORE_CHECKPOINT_MAX_BYTE_LENGTH,
        data ? "set" : "NULL");
  }
  // Refuse early (before writing any bytes) when the job cannot take it; the
  // same checks run again inside the transaction.
  pcp_store_job_t job;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_job_get(store, job_id, &job));
  pcp_store_job_state_t state = job.state;
  pcp_store_job_deinitialize(&job);
  if (state != PCP_STORE_JOB_STATE_RUNNING &&
      state != PCP_STORE_JOB_STATE_CANCELLING) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "job '%s' is %s: checkpoints are written only "
                           "while running or cancelling",
                           job_id, pcp_store_job_state_name(state));
  }

  char relative_path[384];  // "checkpoints/" + id + "/step-" + 20 digits
  char dir_path[PCP_STORE_PATH_MAX_LENGTH + 1];
  char final_path[PCP_STORE_PATH_MAX_LENGTH + 1];
  char temp_path[PCP_STORE_PATH_MAX_LENGTH + 1];
  snprintf(relative_path, sizeof(relative_path),
           "checkpoints/%s/step-%020lld.bin", job_id, (long long)step);
  snprintf(dir_path, sizeof(dir_path), "%s/checkpoints/%s", store->state_dir,
           job_id);
  snprintf(final_path, sizeof(final_path), "%s/%s", store->state_dir,
           relative_path);
  int n =
      snprintf(temp_path, sizeof(temp_path), "%s.%ld-%llu.tmp", final_path,
               (long)getpid(),
               (unsigned long long)atomic_fetch_add(&store->temp_counter, 1));
  if (n < 0 || (size_t)n >= sizeof(temp_path)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "checkpoint path for job '%s' is too long", job_id);
  }
  PCP_RETURN_IF_ERROR(pcp_file_make_directories(dir_path),
                      "creating the checkpoint directory of job '%s'", job_id);
  // Make the new directory entries (checkpoints/, checkpoints/<job>/)
  // durable too.
  char checkpoints_root[PCP_STORE_PATH_MAX_LENGTH + 1];
  snprintf(checkpoints_root, sizeof(checkpoints_root), "%s/checkpoints",
           store->state_dir);
  PCP_RETURN_IF_ERROR_BARE(
      fsync_path(checkpoints_root, O_RDONLY | O_DIRECTORY));
  PCP_RETURN_IF_ERROR_BARE(
      fsync_path(store->state_dir, O_RDONLY | O_DIRECTORY));

  pcp_sha256_t digest;
  pcp_sha256_compute(data ? data : "", byte_length, &digest);
  char hex[PCP_SHA256_HEX_LENGTH + 1];
  pcp_store_sha256_to_hex(&digest, hex);

  // Concurrent writers of the same job and step have their own temp files;
  // the lock below lets exactly one of them be renamed and indexed.
  PCP_RETURN_IF_ERROR_BARE(temp_file_write(temp_path, data, byte_length));

  pcp_store_lock(store);
  int64_t now = pcp_store_now_ns(store);
  int64_t event_id = 0;
  pcp_status_t status = checkpoint_publish_locked(
      store, job_id, step, temp_path, final_path, dir_path, relative_path, hex,
      (uint64_t)byte_length, now, &event_id);
  pcp_store_unlock(store);
  status = pcp_store_event_committed(store, status, event_id, NULL);
  if (status) {
    // The file may already be in place without its row; a retry renames
    // over it, and the temp name is gone either way.
    unlink(temp_path);
    return status;
  }
  if (out_checkpoint) {
    snprintf(out_checkpoint->job_id, sizeof(out_checkpoint->job_id), "%s",
             job_id);
    out_checkpoint->step = step;
    snprintf(out_checkpoint->path, sizeof(out_checkpoint->path), "%s",
             final_path);
    out_checkpoint->sha256 = digest;
    out_checkpoint->byte_length = byte_length;
    out_checkpoint->created_at_ns = now;
  }
  return pcp_ok_status();
}

static pcp_status_t checkpoint_from_row(pcp_store_t* store, sqlite3_stmt* stmt,
                                        pcp_store_checkpoint_t* c) {
  memset(c, 0, sizeof(*c));
  pcp_store_text_column(stmt, 0, c->job_id, sizeof(c->job_id));
  c->step = sqlite3_column_int64(stmt, 1);
  char relative[PCP_STORE_PATH_MAX_LENGTH + 1];
  pcp_store_text_column(stmt, 2, relative, sizeof(relative));
  int n =
      snprintf(c->path, sizeof(c->path), "%s/%s", store->state_dir, relative);
  if (n < 0 || (size_t)n >= sizeof(c->path)) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "stored checkpoint path '%s' is too long", relative);
  }
  if (!pcp_store_sha256_from_hex((const char*)sqlite3_column_text(stmt, 3),
                                 &c->sha256)) {
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "stored SHA-256 of checkpoint %s step %lld",
                           c->job_id, (long long)c->step);
  }
  c->byte_length = (uint64_t)sqlite3_column_int64(stmt, 4);
  c->created_at_ns = sqlite3_column_int64(stmt, 5);
  return pcp_ok_status();
}

pcp_status_t pcp_store_checkpoint_get(pcp_store_t* store, const char* job_id,
                                      int64_t step,
                                      pcp_store_checkpoint_t* out_checkpoint) {
  memset(out_checkpoint, 0, sizeof(*out_checkpoint));
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", job_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status =
      step >= 0
          ? pcp_store_stmt_acquire(
                store, PCP_STORE_STMT_CHECKPOINT_GET,
                "SELECT job_id, step, path, sha256, byte_length, created_at_ns"
                " FROM checkpoints WHERE job_id = ?1 AND step = ?2",
                &stmt)
          : pcp_store_stmt_acquire(
                store, PCP_STORE_STMT_CHECKPOINT_LATEST,
                "SELECT job_id, step, path, sha256, byte_length, created_at_ns"
                " FROM checkpoints WHERE job_id = ?1 AND ?2 < 0"
                " ORDER BY step DESC LIMIT 1",
                &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, job_id, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 2, step);
    status = pcp_store_bind_check(store, brc);
  }
  if (!status) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      status = checkpoint_from_row(store, stmt, out_checkpoint);
    } else if (rc == SQLITE_DONE) {
      status = step >= 0
                   ? pcp_make_status(PCP_STATUS_NOT_FOUND,
                                     "checkpoint of job '%s' at step "
                                     "%lld",
                                     job_id, (long long)step)
                   : pcp_make_status(PCP_STATUS_NOT_FOUND,
                                     "job '%s' has no checkpoint", job_id);
    } else {
      status = pcp_store_db_status(store, rc, "checkpoint get");
    }
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  return status;
}

pcp_status_t pcp_store_checkpoint_list(pcp_store_t* store, const char* job_id,
                                       pcp_store_checkpoint_list_t* out_list) {
  memset(out_list, 0, sizeof(*out_list));
  out_list->allocator = store->allocator;
  PCP_RETURN_IF_ERROR_BARE(pcp_store_id_validate("job id", job_id, false));
  pcp_store_lock(store);
  sqlite3_stmt* stmt = NULL;
  pcp_status_t status = pcp_store_stmt_acquire(
      store, PCP_STORE_STMT_CHECKPOINT_LIST,
      "SELECT job_id, step, path, sha256, byte_length, created_at_ns"
      " FROM checkpoints WHERE job_id = ?1 ORDER BY step LIMIT ?2",
      &stmt);
  if (!status) {
    int brc = sqlite3_bind_text(stmt, 1, job_id, -1, SQLITE_TRANSIENT);
    brc |= sqlite3_bind_int64(stmt, 2, PCP_STORE_LIST_LIMIT_MAX);
    status = pcp_store_bind_check(store, brc);
  }
  size_t capacity = 0;
  int rc = SQLITE_DONE;
  while (!status && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    status = pcp_store_list_reserve(
        out_list->allocator, sizeof(pcp_store_checkpoint_t), out_list->count,
        &capacity, (void**)&out_list->items);
    if (!status) {
      status =
          checkpoint_from_row(store, stmt, &out_list->items[out_list->count]);
    }
    if (!status) {
      ++out_list->count;
    }
  }
  if (!status && rc != SQLITE_DONE) {
    status = pcp_store_db_status(store, rc, "checkpoint list");
  }
  if (stmt) {
    sqlite3_reset(stmt);
  }
  pcp_store_unlock(store);
  if (status) {
    pcp_store_checkpoint_list_deinitialize(out_list);
  }
  return status;
}

pcp_status_t pcp_store_checkpoint_verify(
    const pcp_store_checkpoint_t* checkpoint) {
  int fd = open(checkpoint->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "checkpoint %s step %lld: cannot open %s: %s",
                           checkpoint->job_id, (long long)checkpoint->step,
                           checkpoint->path, strerror(error));
  }
  pcp_sha256_stream_t* stream = NULL;
  pcp_status_t status = pcp_sha256_stream_create(&stream);
  uint64_t total = 0;
  // Streamed in 1 MiB pieces: checkpoints can be far larger than memory.
  // A record carries no allocator and callers verify without a store, so
  // the scratch buffer comes from the system allocator.
  enum { CHUNK_BYTE_LENGTH = 1 << 20 };
  pcp_allocator_t allocator = pcp_allocator_system();
  uint8_t* buffer = NULL;
  if (!status) {
    status =
        pcp_allocator_malloc(allocator, CHUNK_BYTE_LENGTH, (void**)&buffer);
    if (status) {
      status =
          pcp_status_annotate_f(status, "out of memory verifying a checkpoint");
    }
  }
  while (!status) {
    ssize_t n = read(fd, buffer, CHUNK_BYTE_LENGTH);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      status = pcp_status_from_errno(errno, "reading %s", checkpoint->path);
      break;
    }
    if (n == 0) {
      break;
    }
    total += (uint64_t)n;
    if (total > checkpoint->byte_length) {
      break;  // longer than indexed: no need to hash the rest
    }
    pcp_sha256_stream_update(stream, buffer, (size_t)n);
  }
  close(fd);
  pcp_allocator_free(allocator, buffer);
  pcp_sha256_t digest;
  memset(&digest, 0, sizeof(digest));
  if (stream) {
    pcp_sha256_stream_finish(stream, &digest);
  }
  PCP_RETURN_IF_ERROR_BARE(status);
  if (total != checkpoint->byte_length) {
    return pcp_make_status(
        PCP_STATUS_DATA_LOSS,
        "checkpoint %s step %lld: %s has %s bytes than the %llu indexed",
        checkpoint->job_id, (long long)checkpoint->step, checkpoint->path,
        total > checkpoint->byte_length ? "more" : "fewer",
        (unsigned long long)checkpoint->byte_length);
  }
  if (memcmp(digest.bytes, checkpoint->sha256.bytes, sizeof(digest.bytes)) !=
      0) {
    char want[PCP_SHA256_HEX_LENGTH + 1];
    char got[PCP_SHA256_HEX_LENGTH + 1];
    pcp_store_sha256_to_hex(&checkpoint->sha256, want);
    pcp_store_sha256_to_hex(&digest, got);
    return pcp_make_status(PCP_STATUS_DATA_LOSS,
                           "checkpoint %s step %lld: SHA-256 of %s is %s, the "
                           "index says %s",
                           checkpoint->job_id, (long long)checkpoint->step,
                           checkpoint->path, got, want);
  }
  return pcp_ok_status();
}

//===----------------------------------------------------------------------===//
// Crash leftovers
//===----------------------------------------------------------------------===//

static bool ends_with(const char* value, const char* suffix) {
  size_t a = strlen(value);
  size_t b = strlen(suffix);
  return a >= b && memcmp(value + a - b, suffix, b) == 0;
}

// "step-<20 digits>.bin" -> step; false for any other name.
static bool parse_step_file_name(const char* name, int64_t* out_step) {
  static const char kPrefix[] = "step-";
  if (strlen(name) != 5 + 20 + 4 || strncmp(name, kPrefix, 5) != 0 ||
      strcmp(name + 25, ".bin") != 0) {
    return false;
  }
  int64_t step = 0;
  for (int i = 5; i < 25; ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) {
      return false;
    }
    step = step * 10 + (name[i] - '0');
  }
  *out_step = step;
  return true;
}

static pcp_status_t leftovers_in_job_dir(pcp_store_t* store, const char* job_id,
                                         const char* dir_path) {
  DIR* files = opendir(dir_path);
  if (!files) {
    return pcp_ok_status();  // not a directory
  }
  pcp_status_t status = pcp_ok_status();
  struct dirent* file;
  while (!status && (file = readdir(files)) != NULL) {
    int64_t step = 0;
    bool remove = false;
    if (ends_with(file->d_name, ".tmp")) {
      remove = true;
    } else if (parse_step_file_name(file->d_name, &step)) {
      bool indexed = false;
      status = checkpoint_exists_locked(store, job_id, step, &indexed);
      remove = !status && !indexed;
    }
    if (!remove) {
      continue;
    }
    char file_path[PCP_STORE_PATH_MAX_LENGTH + 1];
    int n =
        snprintf(file_path, sizeof(file_path), "%s/%s", dir_path, file->d_name);
    if (n < 0 || (size_t)n >= sizeof(file_path)) {
      continue;
    }
    if (unlink(file_path) != 0 && errno != ENOENT) {
      status = pcp_status_from_errno(errno, "removing %s", file_path);
    }
  }
  closedir(files);
  return status;
}

pcp_status_t pcp_store_checkpoint_leftovers_remove(pcp_store_t* store) {
  char root[PCP_STORE_PATH_MAX_LENGTH + 1];
  snprintf(root, sizeof(root), "%s/checkpoints", store->state_dir);
  DIR* jobs = opendir(root);
  if (!jobs) {
    int error = errno;
    if (error == ENOENT) {
      return pcp_ok_status();
    }
    return pcp_status_from_errno(error, "opening %s", root);
  }
  pcp_status_t status = pcp_ok_status();
  struct dirent* job;
  while (!status && (job = readdir(jobs)) != NULL) {
    if (job->d_name[0] == '.') {
      continue;
    }
    char dir_path[PCP_STORE_PATH_MAX_LENGTH + 1];
    int n = snprintf(dir_path, sizeof(dir_path), "%s/%s", root, job->d_name);
    if (n < 0 || (size_t)n >= sizeof(dir_path)) {
      continue;
    }
    status = leftovers_in_job_dir(store, job->d_name, dir_path);
  }
  closedir(jobs);
  return status;
}
