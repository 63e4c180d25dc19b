// SPDX-License-Identifier: Apache-2.0
// Bounded whole-file reads and crash-safe writes (temp + fsync + rename).

// realpath(3) is XSI: glibc declares it only with _XOPEN_SOURCE.
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"

pcp_status_t pcp_file_read_all(const char* path, size_t max_byte_length,
                               void** out_data, size_t* out_byte_length) {
  *out_data = NULL;
  *out_byte_length = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pcp_status_from_errno(errno, "opening '%s'", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return pcp_status_from_errno(err, "stat '%s'", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "'%s' is not a regular file", path);
  }
  if ((uint64_t)st.st_size > max_byte_length) {
    close(fd);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "'%s' is %lld bytes; the limit is %zu", path,
                           (long long)st.st_size, max_byte_length);
  }
  size_t size = (size_t)st.st_size;
  // 64-byte alignment: IREE loads VMFBs from memory only when aligned.
  void* raw = NULL;
  if (posix_memalign(&raw, 64, size + 1) != 0 || !raw) {
    close(fd);
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                           "out of memory reading '%s' (%zu bytes)", path,
                           size);
  }
  uint8_t* aligned = raw;
  size_t done = 0;
  while (done < size) {
    ssize_t n = read(fd, aligned + done, size - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      close(fd);
      free(aligned);
      return pcp_status_from_errno(err, "reading '%s'", path);
    }
    done += (size_t)n;
  }
  close(fd);
  aligned[size] = 0;
  *out_data = aligned;
  *out_byte_length = size;
  return pcp_ok_status();
}

pcp_status_t pcp_file_append(const char* path, const void* data,
                             size_t byte_length) {
  // No O_CREAT: appending to a file that is gone (or was never written
  // whole) would make a file without its head.
  int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0)
    return pcp_status_from_errno(errno, "opening '%s' to append", path);
  const uint8_t* bytes = data;
  size_t done = 0;
  while (done < byte_length) {
    ssize_t w = write(fd, bytes + done, byte_length - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      int err = errno;
      close(fd);
      return pcp_status_from_errno(err, "appending to '%s'", path);
    }
    done += (size_t)w;
  }
  if (close(fd) != 0)
    return pcp_status_from_errno(errno, "closing '%s'", path);
  return pcp_ok_status();
}

pcp_status_t pcp_file_write_atomic(const char* path, const void* data,
                                   size_t byte_length) {
  char temp[PATH_MAX];
  int n = snprintf(temp, sizeof(temp), "%s.tmp.%ld", path, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof(temp)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "path too long: '%s'",
                           path);
  }
  int fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return pcp_status_from_errno(errno, "creating '%s'", temp);
  const uint8_t* bytes = data;
  size_t done = 0;
  while (done < byte_length) {
    ssize_t w = write(fd, bytes + done, byte_length - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      int err = errno;
      close(fd);
      unlink(temp);
      return pcp_status_from_errno(err, "writing '%s'", temp);
    }
    done += (size_t)w;
  }
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    unlink(temp);
    return pcp_status_from_errno(err, "fsync '%s'", temp);
  }
  close(fd);
  if (rename(temp, path) != 0) {
    int err = errno;
    unlink(temp);
    return pcp_status_from_errno(err, "renaming '%s' to '%s'", temp, path);
  }
  return pcp_ok_status();
}

pcp_status_t pcp_file_make_directories(const char* path) {
  char buffer[PATH_MAX];
  size_t len = strlen(path);
  if (len == 0 || len >= sizeof(buffer)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "bad directory path '%s'", path);
  }
  memcpy(buffer, path, len + 1);
  for (size_t i = 1; i <= len; ++i) {
    if (buffer[i] == '/' || buffer[i] == 0) {
      char saved = buffer[i];
      buffer[i] = 0;
      if (mkdir(buffer, 0755) != 0 && errno != EEXIST) {
        return pcp_status_from_errno(errno, "creating directory '%s'", buffer);
      }
      buffer[i] = saved;
    }
  }
  return pcp_ok_status();
}

bool pcp_file_exists(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

pcp_status_t pcp_file_sha256_fd(int fd, pcp_sha256_t* out_digest,
                                uint64_t* out_byte_length) {
  memset(out_digest, 0, sizeof(*out_digest));
  *out_byte_length = 0;
  enum { kPiece = 1 << 20 };
  uint8_t* buffer = malloc(kPiece);
  if (!buffer) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "hash buffer");
  }
  pcp_sha256_stream_t* stream = NULL;
  pcp_status_t status = pcp_sha256_stream_create(&stream);
  uint64_t total = 0;
  while (!status) {
    ssize_t n = read(fd, buffer, kPiece);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      status = pcp_status_from_errno(errno, "reading for a hash");
    } else if (n == 0) {
      break;
    } else {
      pcp_sha256_stream_update(stream, buffer, (size_t)n);
      total += (uint64_t)n;
    }
  }
  if (stream) {
    pcp_sha256_t digest;
    pcp_sha256_stream_finish(stream, &digest);
    if (!status) {
      *out_digest = digest;
      *out_byte_length = total;
    }
  }
  free(buffer);
  return status;
}

pcp_status_t pcp_file_sha256(const char* path, pcp_sha256_t* out_digest,
                             uint64_t* out_byte_length) {
  memset(out_digest, 0, sizeof(*out_digest));
  *out_byte_length = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "opening '%s'", path);
  }
  pcp_status_t status = pcp_file_sha256_fd(fd, out_digest, out_byte_length);
  close(fd);
  if (status) {
    status = pcp_status_annotate_f(status, "'%s'", path);
  }
  return status;
}

//===----------------------------------------------------------------------===//
// Path confinement
//===----------------------------------------------------------------------===//

// The one refusal of both functions below. It never names the path or says
// why (missing, a loop, no permission): the caller's message goes to a
// client that may be probing the host's files.
static pcp_status_t path_refused(void) {
  return pcp_make_status(PCP_STATUS_PERMISSION_DENIED,
                         "the path cannot be resolved inside the allowed "
                         "directories");
}

pcp_status_t pcp_file_path_resolve(const char* path, char* out_path,
                                   size_t out_capacity) {
  if (out_capacity > 0) {
    out_path[0] = 0;
  }
  if (!path || !path[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "empty path");
  }
  // An absolute copy to cut at slashes.
  char full[PATH_MAX];
  size_t length = strlen(path);
  if (path[0] == '/') {
    if (length >= sizeof(full)) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path too long");
    }
    memcpy(full, path, length + 1);
  } else {
    if (!getcwd(full, sizeof(full))) {
      return path_refused();
    }
    size_t cwd_length = strlen(full);
    if (cwd_length + 1 + length >= sizeof(full)) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path too long");
    }
    full[cwd_length] = '/';
    memcpy(full + cwd_length + 1, path, length + 1);
    length += cwd_length + 1;
  }
  // The longest prefix realpath accepts: cut at the last slash until it
  // resolves. Only "does not exist" (ENOENT, or ENOTDIR under a file) moves
  // the cut; any other failure (a loop, no permission) is a refusal.
  char resolved[PATH_MAX];
  size_t cut = length;
  for (;;) {
    char saved = full[cut];
    full[cut] = 0;
    char* ok = realpath(cut == 0 ? "/" : full, resolved);
    int err = errno;
    full[cut] = saved;
    if (ok) {
      break;
    }
    if (err != ENOENT && err != ENOTDIR) {
      return path_refused();
    }
    while (cut > 0 && full[cut - 1] != '/') {
      --cut;
    }
    if (cut == 0) {
      return path_refused();  // "/" always resolves; not reached
    }
    --cut;  // drop the slash too
  }
  // Append the missing tail one component at a time.
  size_t out_length = strlen(resolved);
  bool first = true;
  const char* p = full + cut;
  while (*p) {
    while (*p == '/') {
      ++p;
    }
    const char* end = p;
    while (*end && *end != '/') {
      ++end;
    }
    size_t n = (size_t)(end - p);
    if (n == 0 || (n == 1 && p[0] == '.')) {
      p = end;
      continue;
    }
    if (n == 2 && p[0] == '.' && p[1] == '.') {
      // A `..` below a missing directory cannot be resolved by the
      // filesystem; taking it lexically would let "missing/../../x" climb.
      return path_refused();
    }
    bool root = out_length == 1;  // "/"
    if (out_length + (root ? 0 : 1) + n >= sizeof(resolved)) {
      return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path too long");
    }
    if (!root) {
      resolved[out_length++] = '/';
    }
    memcpy(resolved + out_length, p, n);
    out_length += n;
    resolved[out_length] = 0;
    if (first) {
      // realpath said this component is missing; if lstat still finds it,
      // it is a dangling link whose target could be created later.
      struct stat st;
      if (lstat(resolved, &st) == 0) {
        return path_refused();
      }
      first = false;
    }
    p = end;
  }
  if (out_length + 1 > out_capacity) {
    return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path too long");
  }
  memcpy(out_path, resolved, out_length + 1);
  return pcp_ok_status();
}

pcp_status_t pcp_file_path_confine(const char* path, const char* const* roots,
                                   size_t root_count, char* out_path,
                                   size_t out_capacity) {
  if (out_capacity > 0) {
    out_path[0] = 0;
  }
  char resolved[PATH_MAX];
  pcp_status_t status = pcp_file_path_resolve(path, resolved, sizeof(resolved));
  if (status) {
    if (pcp_status_code(status) == PCP_STATUS_INVALID_ARGUMENT) {
      return status;
    }
    pcp_status_ignore(status);
    return path_refused();
  }
  for (size_t i = 0; i < root_count; ++i) {
    char root[PATH_MAX];
    if (!roots[i] || !roots[i][0]) {
      continue;
    }
    status = pcp_file_path_resolve(roots[i], root, sizeof(root));
    if (status) {
      pcp_status_ignore(status);
      continue;
    }
    size_t n = strlen(root);
    // "/" holds everything; otherwise the root itself or below a slash
    // ("/srv/data" must not admit "/srv/database").
    bool inside = (n == 1 && root[0] == '/') ||
                  (strncmp(resolved, root, n) == 0 &&
                   (resolved[n] == 0 || resolved[n] == '/'));
    if (inside) {
      size_t length = strlen(resolved);
      if (length + 1 > out_capacity) {
        return pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED, "path too long");
      }
      memcpy(out_path, resolved, length + 1);
      return pcp_ok_status();
    }
  }
  return path_refused();
}
