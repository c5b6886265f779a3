/*
 * _recvfs: the recording VFS's I/O in C (see docs/sqlite-store.md, "The VFS in C").
 *
 * A VFS registered over SQLite's default VFS. Every file is read, written, locked and
 * mapped by the default VFS directly, without Python. Python (stores.sqlite.vfs) is called
 * only where something is recorded:
 *
 *   hooks.open(path, flags) -> file hook or None   when a named file is opened
 *   hooks.delete(path, size)                        after a file was deleted
 *   hook.write(offset, data)                        a write to a recorded file
 *   hook.truncate(size), hook.sync(flags)           (no local fsync: the log is durable)
 *   hook.note_backfill()                            a main database write left unrecorded
 *   hook.close()
 *
 * A file hook says at open whether its writes are `buffered` (rollback journals and WALs:
 * contiguous writes are gathered here and handed to Python as one write, so a commit's WAL
 * frames cost one Python call instead of two per page), whether it is a `main` database
 * (whose writes are not recorded while the VFS is `backfilling`: the store's own WAL
 * checkpoint copies frames the WAL recorded already), and `device_flags` to add to the
 * file's device characteristics. A write at offset 0 is never gathered: Python looks at it
 * alone to see a journal or WAL start over.
 *
 * Order: the gathered write is handed to Python before any other call into Python, so
 * Python sees every recorded operation in the order SQLite made it.
 *
 * Errors: an exception raised by a hook is left set in the calling thread (APSW raises it
 * in place of SQLite's error when the statement returns) and the method fails with an I/O
 * error code. If SQLite calls in again before returning, the calls go on, and the first
 * exception is the one kept. A hook's failure at close, whose error SQLite ignores, is
 * reported as unraisable instead. A write that could not be gathered (out of memory) fails
 * every later recorded operation of the VFS: the log would miss it.
 *
 * The module is also an SQLite extension (entry point sqlite3_recvfs_init): loading it into
 * any connection of APSW's SQLite gives it that library's API, which `register` needs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A gathered write is handed to Python once it holds this many bytes. */
#define GATHER_LIMIT (1 << 20)

typedef struct RecFile RecFile;

typedef struct RecVfs {
  sqlite3_vfs base; /* What SQLite sees; pAppData is unused. */
  sqlite3_vfs *real;
  PyObject *hooks;
  char *name;
  struct RecVfs *next;
  /* The gathered write: `len` bytes for `file` at `offset`. */
  RecFile *file;
  sqlite3_int64 offset;
  char *buf;
  size_t len, cap;
  int backfilling;
  int broken;     /* A write could not be recorded: nothing more may be. */
  int files;      /* Files open: it may not be unregistered. */
  unsigned epoch; /* Counts backfilling periods: note_backfill once per file and period. */
} RecVfs;

struct RecFile {
  sqlite3_file base;
  RecVfs *vfs;
  PyObject *hook; /* NULL: not recorded. */
  int buffered;
  int main;
  int device_flags;
  unsigned noted_epoch;
  sqlite3_file *real; /* Just after this struct. */
};

/* RecFile rounded up so the real file after it is aligned. */
#define RECFILE_SIZE ((sizeof(RecFile) + 15) & ~(size_t)15)

static RecVfs *registered = NULL; /* Guarded by the GIL. */

/* -- Calling Python (with the GIL held) ------------------------------------------------- */

/* Call obj.method(*args) (args stolen; NULL means a failed build). Returns 0, or -1 with
 * the first exception of this statement left set (an earlier one is kept). */
static int call_hook(PyObject *obj, const char *method, PyObject *args) {
  PyObject *et = NULL, *ev = NULL, *etb = NULL;
  PyErr_Fetch(&et, &ev, &etb);
  PyObject *result = NULL;
  if (args != NULL) {
    PyObject *fn = PyObject_GetAttrString(obj, method);
    if (fn != NULL) {
      result = PyObject_Call(fn, args, NULL);
      Py_DECREF(fn);
    }
    Py_DECREF(args);
  }
  if (result != NULL) {
    Py_DECREF(result);
    PyErr_Restore(et, ev, etb);
    return 0;
  }
  if (et != NULL) { /* Keep the first error: it explains the others. */
    PyErr_Clear();
    PyErr_Restore(et, ev, etb);
  }
  return -1;
}

/* Hand the gathered write to its file's hook. */
static int drain(RecVfs *v) {
  if (v->broken) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_RuntimeError, "an earlier write to a recorded SQLite file was not recorded");
    return -1;
  }
  if (v->len == 0) return 0;
  RecFile *f = v->file;
  PyObject *data = PyBytes_FromStringAndSize(v->buf, (Py_ssize_t)v->len);
  sqlite3_int64 offset = v->offset;
  v->len = 0;
  v->file = NULL;
  /* SQLite was told these writes were made: if they are not recorded, nothing later may be. */
  if (data == NULL || call_hook(f->hook, "write", Py_BuildValue("(LN)", (long long)offset, data))) {
    v->broken = 1;
    return -1;
  }
  return 0;
}

static int gather(RecVfs *v, RecFile *f, const void *data, int amount, sqlite3_int64 offset) {
  if (v->len > 0 && (v->file != f || v->offset + (sqlite3_int64)v->len != offset)) {
    PyGILState_STATE g = PyGILState_Ensure();
    int failed = drain(v);
    PyGILState_Release(g);
    if (failed) return -1;
  }
  if (v->len + (size_t)amount > v->cap) {
    size_t cap = v->cap ? v->cap : 256 * 1024;
    while (cap < v->len + (size_t)amount) cap *= 2;
    char *buf = realloc(v->buf, cap);
    if (buf == NULL) {
      v->broken = 1;
      PyGILState_STATE g = PyGILState_Ensure();
      if (!PyErr_Occurred()) PyErr_NoMemory();
      PyGILState_Release(g);
      return -1;
    }
    v->buf = buf;
    v->cap = cap;
  }
  if (v->len == 0) {
    v->file = f;
    v->offset = offset;
  }
  memcpy(v->buf + v->len, data, (size_t)amount);
  v->len += (size_t)amount;
  if (v->len >= GATHER_LIMIT) {
    PyGILState_STATE g = PyGILState_Ensure();
    int failed = drain(v);
    PyGILState_Release(g);
    if (failed) return -1;
  }
  return 0;
}

/* Drain, then call f's hook (args stolen). */
static int drain_and_call(RecVfs *v, PyObject *hook, const char *method, PyObject *args) {
  if (drain(v)) {
    Py_XDECREF(args);
    return -1;
  }
  return call_hook(hook, method, args);
}

/* -- File methods ----------------------------------------------------------------------- */

static int rec_close(sqlite3_file *file) {
  RecFile *f = (RecFile *)file;
  int failed = 0;
  if (f->hook != NULL) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *et = NULL, *ev = NULL, *etb = NULL;
    PyErr_Fetch(&et, &ev, &etb);
    failed = drain(f->vfs);
    failed |= call_hook(f->hook, "close", PyTuple_New(0));
    if (PyErr_Occurred()) PyErr_WriteUnraisable(f->hook);
    PyErr_Restore(et, ev, etb);
    Py_CLEAR(f->hook);
    PyGILState_Release(g);
  }
  int rc = f->real->pMethods->xClose(f->real);
  f->vfs->files--;
  return failed && rc == SQLITE_OK ? SQLITE_IOERR_CLOSE : rc;
}

static int rec_read(sqlite3_file *file, void *buf, int amount, sqlite3_int64 offset) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xRead(f->real, buf, amount, offset);
}

static int rec_write(sqlite3_file *file, const void *data, int amount, sqlite3_int64 offset) {
  RecFile *f = (RecFile *)file;
  int rc = f->real->pMethods->xWrite(f->real, data, amount, offset);
  if (rc != SQLITE_OK || f->hook == NULL || amount <= 0) return rc;
  RecVfs *v = f->vfs;
  if (f->buffered && offset != 0 && !v->broken)
    return gather(v, f, data, amount, offset) ? SQLITE_IOERR_WRITE : SQLITE_OK;
  if (f->main && v->backfilling && f->noted_epoch == v->epoch) return SQLITE_OK;
  int failed;
  PyGILState_STATE g = PyGILState_Ensure();
  if (f->main && v->backfilling) {
    failed = drain_and_call(v, f->hook, "note_backfill", PyTuple_New(0));
    if (!failed) f->noted_epoch = v->epoch;
  } else {
    PyObject *bytes = PyBytes_FromStringAndSize(data, amount);
    failed = bytes == NULL ? -1
                           : drain_and_call(v, f->hook, "write", Py_BuildValue("(LN)", (long long)offset, bytes));
  }
  PyGILState_Release(g);
  return failed ? SQLITE_IOERR_WRITE : SQLITE_OK;
}

static int rec_truncate(sqlite3_file *file, sqlite3_int64 size) {
  RecFile *f = (RecFile *)file;
  int rc = f->real->pMethods->xTruncate(f->real, size);
  if (rc != SQLITE_OK || f->hook == NULL) return rc;
  PyGILState_STATE g = PyGILState_Ensure();
  int failed = drain_and_call(f->vfs, f->hook, "truncate", Py_BuildValue("(L)", (long long)size));
  PyGILState_Release(g);
  return failed ? SQLITE_IOERR_TRUNCATE : SQLITE_OK;
}

static int rec_sync(sqlite3_file *file, int flags) {
  RecFile *f = (RecFile *)file;
  if (f->hook == NULL) return f->real->pMethods->xSync(f->real, flags);
  PyGILState_STATE g = PyGILState_Ensure();
  int failed = drain_and_call(f->vfs, f->hook, "sync", Py_BuildValue("(i)", flags));
  PyGILState_Release(g);
  /* A sync may compact, after which a base holds every copy so far: later ones are noted. */
  if (f->main) f->noted_epoch = f->vfs->epoch - 1;
  return failed ? SQLITE_IOERR_FSYNC : SQLITE_OK;
}

static int rec_file_size(sqlite3_file *file, sqlite3_int64 *size) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xFileSize(f->real, size);
}

static int rec_lock(sqlite3_file *file, int level) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xLock(f->real, level);
}

static int rec_unlock(sqlite3_file *file, int level) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xUnlock(f->real, level);
}

static int rec_check_reserved_lock(sqlite3_file *file, int *out) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xCheckReservedLock(f->real, out);
}

static int rec_file_control(sqlite3_file *file, int op, void *arg) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xFileControl(f->real, op, arg);
}

static int rec_sector_size(sqlite3_file *file) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xSectorSize(f->real);
}

static int rec_device_characteristics(sqlite3_file *file) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xDeviceCharacteristics(f->real) | f->device_flags;
}

static int rec_shm_map(sqlite3_file *file, int page, int size, int extend, void volatile **out) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xShmMap(f->real, page, size, extend, out);
}

static int rec_shm_lock(sqlite3_file *file, int offset, int n, int flags) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xShmLock(f->real, offset, n, flags);
}

static void rec_shm_barrier(sqlite3_file *file) {
  RecFile *f = (RecFile *)file;
  f->real->pMethods->xShmBarrier(f->real);
}

static int rec_shm_unmap(sqlite3_file *file, int delete_flag) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xShmUnmap(f->real, delete_flag);
}

static int rec_fetch(sqlite3_file *file, sqlite3_int64 offset, int amount, void **out) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xFetch(f->real, offset, amount, out);
}

static int rec_unfetch(sqlite3_file *file, sqlite3_int64 offset, void *p) {
  RecFile *f = (RecFile *)file;
  return f->real->pMethods->xUnfetch(f->real, offset, p);
}

static const sqlite3_io_methods rec_io_methods_v3 = {
    3,
    rec_close,
    rec_read,
    rec_write,
    rec_truncate,
    rec_sync,
    rec_file_size,
    rec_lock,
    rec_unlock,
    rec_check_reserved_lock,
    rec_file_control,
    rec_sector_size,
    rec_device_characteristics,
    rec_shm_map,
    rec_shm_lock,
    rec_shm_barrier,
    rec_shm_unmap,
    rec_fetch,
    rec_unfetch,
};

/* The methods of a file whose real methods are of `version` (1-3): SQLite looks at a file's
 * version before its shared-memory and mapping methods. */
static sqlite3_io_methods rec_io_methods_v1, rec_io_methods_v2;

static const sqlite3_io_methods *methods_for(int version) {
  if (rec_io_methods_v1.iVersion == 0) {
    rec_io_methods_v2 = rec_io_methods_v3;
    rec_io_methods_v2.iVersion = 2;
    rec_io_methods_v2.xFetch = NULL;
    rec_io_methods_v2.xUnfetch = NULL;
    rec_io_methods_v1 = rec_io_methods_v2;
    rec_io_methods_v1.iVersion = 1;
    rec_io_methods_v1.xShmMap = NULL;
    rec_io_methods_v1.xShmLock = NULL;
    rec_io_methods_v1.xShmBarrier = NULL;
    rec_io_methods_v1.xShmUnmap = NULL;
  }
  return version >= 3 ? &rec_io_methods_v3 : version == 2 ? &rec_io_methods_v2 : &rec_io_methods_v1;
}

/* -- VFS methods ------------------------------------------------------------------------ */

static long attr_long(PyObject *obj, const char *name) {
  PyObject *value = PyObject_GetAttrString(obj, name);
  if (value == NULL) return -1;
  long result = PyObject_IsTrue(value);
  if (PyLong_Check(value)) result = PyLong_AsLong(value);
  Py_DECREF(value);
  return result;
}

/* Ask hooks.open(path, flags) for f's hook; 0 or -1 (exception set). */
static int open_hook(RecVfs *v, RecFile *f, const char *path, int flags) {
  if (drain(v)) return -1;
  PyObject *et = NULL, *ev = NULL, *etb = NULL;
  PyErr_Fetch(&et, &ev, &etb);
  PyObject *hook = PyObject_CallMethod(v->hooks, "open", "(si)", path, flags);
  if (hook == NULL) {
    if (et != NULL) {
      PyErr_Clear();
      PyErr_Restore(et, ev, etb);
    }
    return -1;
  }
  if (hook != Py_None) {
    long buffered = attr_long(hook, "buffered");
    long main = attr_long(hook, "main");
    long device_flags = attr_long(hook, "device_flags");
    if (buffered < 0 || main < 0 || device_flags < 0 || PyErr_Occurred()) {
      Py_DECREF(hook);
      if (et != NULL) {
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
      }
      return -1;
    }
    f->hook = hook;
    f->buffered = (int)buffered;
    f->main = (int)main;
    f->device_flags = (int)device_flags;
    f->noted_epoch = v->epoch - 1;
  } else {
    Py_DECREF(hook);
  }
  PyErr_Restore(et, ev, etb);
  return 0;
}

static int rec_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags) {
  RecVfs *v = (RecVfs *)vfs;
  RecFile *f = (RecFile *)file;
  memset(f, 0, sizeof(RecFile));
  f->vfs = v;
  f->real = (sqlite3_file *)((char *)file + RECFILE_SIZE);
  int named = name != NULL && !(flags & SQLITE_OPEN_DELETEONCLOSE);
  struct stat st;
  int existed = named && stat(name, &st) == 0;
  int rc = v->real->xOpen(v->real, name, f->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    /* The real open may have set its methods: SQLite then calls xClose on our file. */
    f->base.pMethods = f->real->pMethods ? methods_for(f->real->pMethods->iVersion) : NULL;
    if (f->base.pMethods != NULL) v->files++;
    return rc;
  }
  if (named) {
    PyGILState_STATE g = PyGILState_Ensure();
    int failed = open_hook(v, f, name, flags);
    PyGILState_Release(g);
    if (failed) {
      f->real->pMethods->xClose(f->real);
      f->base.pMethods = NULL;
      if (!existed) unlink(name); /* A refused file is not left behind. */
      return SQLITE_CANTOPEN;
    }
  }
  f->base.pMethods = methods_for(f->real->pMethods->iVersion);
  v->files++;
  return SQLITE_OK;
}

static int rec_delete(sqlite3_vfs *vfs, const char *path, int sync_dir) {
  RecVfs *v = (RecVfs *)vfs;
  PyGILState_STATE g = PyGILState_Ensure();
  int failed = drain(v);
  PyGILState_Release(g);
  if (failed) return SQLITE_IOERR_DELETE;
  struct stat st;
  long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
  int rc = v->real->xDelete(v->real, path, sync_dir);
  if (rc != SQLITE_OK) return rc;
  g = PyGILState_Ensure();
  failed = call_hook(v->hooks, "delete", Py_BuildValue("(sL)", path, size));
  PyGILState_Release(g);
  return failed ? SQLITE_IOERR_DELETE : SQLITE_OK;
}

static int rec_access(sqlite3_vfs *vfs, const char *path, int flags, int *out) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xAccess(v->real, path, flags, out);
}

static int rec_full_pathname(sqlite3_vfs *vfs, const char *path, int n, char *out) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xFullPathname(v->real, path, n, out);
}

static void *rec_dl_open(sqlite3_vfs *vfs, const char *path) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xDlOpen(v->real, path);
}

static void rec_dl_error(sqlite3_vfs *vfs, int n, char *out) {
  RecVfs *v = (RecVfs *)vfs;
  v->real->xDlError(v->real, n, out);
}

static void (*rec_dl_sym(sqlite3_vfs *vfs, void *handle, const char *symbol))(void) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xDlSym(v->real, handle, symbol);
}

static void rec_dl_close(sqlite3_vfs *vfs, void *handle) {
  RecVfs *v = (RecVfs *)vfs;
  v->real->xDlClose(v->real, handle);
}

static int rec_randomness(sqlite3_vfs *vfs, int n, char *out) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xRandomness(v->real, n, out);
}

static int rec_sleep(sqlite3_vfs *vfs, int micros) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xSleep(v->real, micros);
}

static int rec_current_time(sqlite3_vfs *vfs, double *out) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xCurrentTime(v->real, out);
}

static int rec_get_last_error(sqlite3_vfs *vfs, int n, char *out) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xGetLastError(v->real, n, out);
}

static int rec_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *out) {
  RecVfs *v = (RecVfs *)vfs;
  return v->real->xCurrentTimeInt64(v->real, out);
}

/* The VFS's methods; its size, path length and name are filled in at registration. */
static const sqlite3_vfs rec_vfs_template = {
    .iVersion = 2,
    .xOpen = rec_open,
    .xDelete = rec_delete,
    .xAccess = rec_access,
    .xFullPathname = rec_full_pathname,
    .xDlOpen = rec_dl_open,
    .xDlError = rec_dl_error,
    .xDlSym = rec_dl_sym,
    .xDlClose = rec_dl_close,
    .xRandomness = rec_randomness,
    .xSleep = rec_sleep,
    .xCurrentTime = rec_current_time,
    .xGetLastError = rec_get_last_error,
    .xCurrentTimeInt64 = rec_current_time_int64,
};

/* -- The module ------------------------------------------------------------------------- */

static RecVfs *find(const char *name) {
  for (RecVfs *v = registered; v != NULL; v = v->next)
    if (strcmp(v->name, name) == 0) return v;
  return NULL;
}

static PyObject *py_register(PyObject *self, PyObject *args) {
  const char *name;
  PyObject *hooks;
  if (!PyArg_ParseTuple(args, "sO:register", &name, &hooks)) return NULL;
  if (sqlite3_api == NULL) return PyErr_Format(PyExc_RuntimeError, "_recvfs is not loaded into SQLite");
  if (find(name) != NULL || sqlite3_vfs_find(name) != NULL)
    return PyErr_Format(PyExc_ValueError, "a VFS named %s is registered already", name);
  sqlite3_vfs *real = sqlite3_vfs_find(NULL);
  if (real == NULL || real->iVersion < 2) return PyErr_Format(PyExc_RuntimeError, "no usable default VFS");
  RecVfs *v = calloc(1, sizeof(RecVfs));
  if (v == NULL) return PyErr_NoMemory();
  v->name = strdup(name);
  if (v->name == NULL) {
    free(v);
    return PyErr_NoMemory();
  }
  v->real = real;
  v->base = rec_vfs_template;
  v->base.szOsFile = (int)(RECFILE_SIZE + (size_t)real->szOsFile);
  v->base.mxPathname = real->mxPathname;
  v->base.zName = v->name;
  int rc = sqlite3_vfs_register(&v->base, 0);
  if (rc != SQLITE_OK) {
    free(v->name);
    free(v);
    return PyErr_Format(PyExc_RuntimeError, "sqlite3_vfs_register(%s) failed: %d", name, rc);
  }
  Py_INCREF(hooks);
  v->hooks = hooks;
  v->next = registered;
  registered = v;
  Py_RETURN_NONE;
}

static PyObject *py_unregister(PyObject *self, PyObject *args) {
  const char *name;
  if (!PyArg_ParseTuple(args, "s:unregister", &name)) return NULL;
  RecVfs **link = &registered;
  while (*link != NULL && strcmp((*link)->name, name) != 0) link = &(*link)->next;
  RecVfs *v = *link;
  if (v == NULL) Py_RETURN_NONE;
  if (v->files > 0)
    return PyErr_Format(PyExc_RuntimeError, "VFS %s still has %d files open: close its connections first", name, v->files);
  *link = v->next;
  sqlite3_vfs_unregister(&v->base);
  Py_CLEAR(v->hooks);
  free(v->buf);
  free(v->name);
  free(v);
  Py_RETURN_NONE;
}

static PyObject *py_set_backfilling(PyObject *self, PyObject *args) {
  const char *name;
  int on;
  if (!PyArg_ParseTuple(args, "sp:set_backfilling", &name, &on)) return NULL;
  RecVfs *v = find(name);
  if (v == NULL) return PyErr_Format(PyExc_KeyError, "no recording VFS named %s", name);
  if (on && !v->backfilling) v->epoch++;
  v->backfilling = on;
  Py_RETURN_NONE;
}

static PyObject *py_loaded(PyObject *self, PyObject *unused) { return PyBool_FromLong(sqlite3_api != NULL); }

static PyMethodDef methods[] = {
    {"register", py_register, METH_VARARGS,
     "register(name, hooks): register VFS `name` over the default VFS, calling `hooks`."},
    {"unregister", py_unregister, METH_VARARGS,
     "unregister(name): unregister VFS `name` (no connection may use it)."},
    {"set_backfilling", py_set_backfilling, METH_VARARGS,
     "set_backfilling(name, on): whether main database writes go unrecorded (note_backfill)."},
    {"loaded", py_loaded, METH_NOARGS, "loaded(): whether the module was loaded into SQLite."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recvfs", "The recording VFS's I/O in C (stores.sqlite.vfs).", -1, methods,
};

PyMODINIT_FUNC PyInit__recvfs(void) { return PyModule_Create(&module); }

int sqlite3_recvfs_init(sqlite3 *db, char **errmsg, const sqlite3_api_routines *api) {
  (void)db;
  (void)errmsg;
  SQLITE_EXTENSION_INIT2(api);
  return SQLITE_OK;
}
