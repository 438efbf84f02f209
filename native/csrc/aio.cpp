// Async file I/O between CPU tensors and files: the engine behind
// native.AsyncIOHandle (DeepSpeed's aio_handle API).
//
// A handle owns `intra_op_parallelism` worker threads. Each I/O op (one tensor
// to/from one file range) is split into one task per worker; a task moves its
// bytes with pread/pwrite calls of block_size bytes (single_submit) or of
// block_size * queue_depth bytes (batched submission). Without overlap_events
// an op is partitioned statically into equal block-aligned slices, as
// DeepSpeed does; with it, workers claim batches from a shared cursor so a
// fast worker takes over the work of a slow one.
//
// O_DIRECT is used when the buffer and file offset are 4 KiB aligned and the
// filesystem accepts it; unaligned tails, and filesystems that refuse O_DIRECT
// (tmpfs), go through the page cache. Errors never throw on worker threads:
// they are recorded on the op and handed to Python at wait(), which turns them
// into OSError/EOFError naming the file.
//
// Every submitted op gets a ticket: wait_ops(tickets) waits for those ops only
// and is_done(ticket) polls one, so a reader can take the first of several
// reads in flight without waiting for the rest (wait() still collects all).

#include <torch/extension.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <vector>

namespace {

// O_DIRECT needs buffer, offset and length aligned to the logical block size;
// 4 KiB covers every common device and is the page size of the locked buffers.
constexpr int64_t kDirectAlignment = 4096;
constexpr int64_t kHugePage = 2 << 20;

// (errno, path, "pread"/"pwrite", detail); errno 0 means a short read.
using IoError = std::tuple<int, std::string, std::string, std::string>;

struct IoOp {
  at::Tensor tensor;  // keeps the buffer alive until the op completes
  std::string path;
  bool is_read = false;
  char* buffer = nullptr;
  int64_t nbytes = 0;
  int64_t file_offset = 0;
  int buffered_fd = -1;
  int direct_fd = -1;
  int64_t slice_bytes = 0;           // static partition (overlap_events=false)
  std::atomic<int64_t> cursor{0};    // dynamic claiming (overlap_events=true)
  int tasks_left = 0;                // guarded by the handle's mutex
  bool done = false;                 // guarded by the handle's mutex
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  IoError error;

  const char* name() const { return is_read ? "pread" : "pwrite"; }

  void fail(int err, const std::string& detail) {
    std::lock_guard<std::mutex> guard(error_mutex);
    if (!failed.exchange(true)) error = IoError{err, path, name(), detail};
  }
};

// Workers hold a raw pointer: the op's owner (pending_ or the caller of run)
// keeps it alive until `done`, so a worker never drops the last reference to
// the tensor -- which would need the GIL that a Python thread joining the
// workers in ~AioHandle is holding.
struct Task {
  IoOp* op;
  int index;
};

void close_fds(IoOp& op) {
  if (op.buffered_fd >= 0) ::close(op.buffered_fd);
  if (op.direct_fd >= 0) ::close(op.direct_fd);
  op.buffered_fd = op.direct_fd = -1;
}

// Moves exactly `len` bytes at file position `pos`, retrying partial
// transfers. Returns 0, an errno, or -1 for end of file on a read.
int transfer_all(int fd, bool is_read, char* buf, int64_t len, int64_t pos) {
  while (len > 0) {
    const ssize_t n = is_read ? ::pread(fd, buf, static_cast<size_t>(len), pos)
                              : ::pwrite(fd, buf, static_cast<size_t>(len), pos);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return is_read ? -1 : EIO;
    buf += n;
    pos += n;
    len -= n;
  }
  return 0;
}

class AioHandle {
 public:
  AioHandle(int64_t block_size, int64_t queue_depth, bool single_submit, bool overlap_events,
            int64_t intra_op_parallelism)
      : block_size_(block_size),
        queue_depth_(queue_depth),
        single_submit_(single_submit),
        overlap_events_(overlap_events),
        num_threads_(intra_op_parallelism) {
    TORCH_CHECK(block_size > 0, "AsyncIOHandle: block_size must be > 0, got ", block_size);
    TORCH_CHECK(queue_depth > 0, "AsyncIOHandle: queue_depth must be > 0, got ", queue_depth);
    TORCH_CHECK(intra_op_parallelism > 0,
                "AsyncIOHandle: intra_op_parallelism must be > 0, got ", intra_op_parallelism);
    for (int64_t i = 0; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  ~AioHandle() {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  int64_t block_size() const { return block_size_; }
  int64_t queue_depth() const { return queue_depth_; }
  bool single_submit() const { return single_submit_; }
  bool overlap_events() const { return overlap_events_; }
  int64_t intra_op_parallelism() const { return num_threads_; }

  // Queues one op; returns its ticket. Its outcome is collected by wait_ops or wait().
  int64_t submit(const at::Tensor& tensor, const std::string& path, bool is_read, int64_t file_offset) {
    auto op = start(tensor, path, is_read, file_offset);
    std::lock_guard<std::mutex> guard(mutex_);
    const int64_t ticket = next_ticket_++;
    pending_.emplace(ticket, std::move(op));
    return ticket;
  }

  // Waits for the ops of `tickets` only; returns their errors. Tickets already
  // collected (by an earlier wait) are skipped.
  std::vector<IoError> wait_ops(const std::vector<int64_t>& tickets) {
    std::vector<std::shared_ptr<IoOp>> ops;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      for (const int64_t ticket : tickets) {
        auto it = pending_.find(ticket);
        if (it == pending_.end()) continue;
        ops.push_back(std::move(it->second));
        pending_.erase(it);
      }
    }
    return collect(ops);
  }

  // Whether the op of `ticket` has finished (true for a ticket already collected).
  bool is_done(int64_t ticket) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = pending_.find(ticket);
    return it == pending_.end() || it->second->done;
  }

  // Runs one op to completion; returns the errors (empty or one).
  std::vector<IoError> run(const at::Tensor& tensor, const std::string& path, bool is_read,
                           int64_t file_offset) {
    auto op = start(tensor, path, is_read, file_offset);
    wait_for(*op);
    std::vector<IoError> errors;
    if (op->failed) errors.push_back(op->error);
    return errors;
  }

  // Waits for every submitted op; returns how many completed and their errors.
  std::tuple<int64_t, std::vector<IoError>> wait() {
    std::vector<std::shared_ptr<IoOp>> ops;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      for (auto& entry : pending_) ops.push_back(std::move(entry.second));
      pending_.clear();
    }
    return {static_cast<int64_t>(ops.size()), collect(ops)};
  }

  int64_t pending() {
    std::lock_guard<std::mutex> guard(mutex_);
    return static_cast<int64_t>(pending_.size());
  }

  // Page-aligned, mlock'ed (when RLIMIT_MEMLOCK allows) host memory, so that
  // O_DIRECT applies and the kernel never pages the buffer out mid-transfer.
  // Buffers of 2 MiB and more are mapped on their own, start on a 2 MiB
  // boundary and ask for transparent huge pages: O_DIRECT reads into them ran
  // 1.4-1.8x faster on the virtual disk of benches/aio.py than into a
  // posix_memalign'ed buffer (likely fewer, larger segments per request and
  // fewer TLB misses in the copy), see BENCHMARKS.md.
  at::Tensor new_cpu_locked_tensor(int64_t num_elem, const at::Tensor& example) {
    TORCH_CHECK(num_elem >= 0, "new_cpu_locked_tensor: num_elem must be >= 0, got ", num_elem);
    const int64_t nbytes = std::max<int64_t>(num_elem * example.element_size(), 1);
    const int64_t rounded = (nbytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    void* base = nullptr;
    char* ptr = nullptr;
    size_t mapped = 0;  // bytes mmap'ed at base (0: posix_memalign)
    if (rounded >= kHugePage) {
      mapped = static_cast<size_t>(rounded + kHugePage);  // room to move the start to a 2 MiB boundary
      base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(base != MAP_FAILED, "new_cpu_locked_tensor: cannot map ", mapped, " bytes: ",
                  std::strerror(errno));
      const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage;
      ptr = reinterpret_cast<char*>(start);
      ::madvise(ptr, static_cast<size_t>(rounded), MADV_HUGEPAGE);  // advice only: failure is harmless
    } else {
      const int rc = posix_memalign(&base, kDirectAlignment, static_cast<size_t>(rounded));
      TORCH_CHECK(rc == 0, "new_cpu_locked_tensor: cannot allocate ", rounded, " bytes: ", std::strerror(rc));
      ptr = static_cast<char*>(base);
    }
    const bool locked = ::mlock(ptr, static_cast<size_t>(rounded)) == 0;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      locked_.insert(ptr);
    }
    auto deleter = [base, mapped, rounded, locked](void* p) {
      if (locked) ::munlock(p, static_cast<size_t>(rounded));
      if (mapped > 0) {
        ::munmap(base, mapped);
      } else {
        std::free(base);
      }
    };
    return torch::from_blob(ptr, {num_elem}, deleter, example.options().device(at::kCPU));
  }

  // Forgets a tensor from new_cpu_locked_tensor. The memory itself is released
  // when the last reference to the tensor goes, so a stale view cannot dangle.
  bool free_cpu_locked_tensor(const at::Tensor& tensor) {
    std::lock_guard<std::mutex> guard(mutex_);
    return locked_.erase(tensor.storage().data_ptr().get()) == 1;
  }

 private:
  std::shared_ptr<IoOp> start(const at::Tensor& tensor, const std::string& path, bool is_read,
                              int64_t file_offset) {
    TORCH_CHECK(tensor.device().is_cpu(), "AsyncIOHandle: ", path, ": buffer must be a CPU tensor, got ",
                tensor.device());
    TORCH_CHECK(tensor.is_contiguous(), "AsyncIOHandle: ", path, ": buffer must be contiguous");
    TORCH_CHECK(file_offset >= 0, "AsyncIOHandle: ", path, ": file_offset must be >= 0, got ", file_offset);

    auto op = std::make_shared<IoOp>();
    op->tensor = tensor;
    op->path = path;
    op->is_read = is_read;
    op->buffer = static_cast<char*>(tensor.data_ptr());
    op->nbytes = static_cast<int64_t>(tensor.nbytes());
    op->file_offset = file_offset;
    open_files(*op);

    const int64_t blocks = (op->nbytes + block_size_ - 1) / block_size_;
    const int64_t tasks = op->failed ? 0 : std::min<int64_t>(num_threads_, blocks);
    // Block-aligned slices keep every slice start O_DIRECT-aligned.
    op->slice_bytes = tasks > 0 ? (blocks + tasks - 1) / tasks * block_size_ : 0;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      op->tasks_left = static_cast<int>(tasks);
      if (tasks == 0) {
        close_fds(*op);
        op->done = true;
      }
      for (int64_t i = 0; i < tasks; ++i) queue_.push_back(Task{op.get(), static_cast<int>(i)});
    }
    if (tasks > 0) work_cv_.notify_all();
    return op;
  }

  void open_files(IoOp& op) {
    const int flags = op.is_read ? O_RDONLY : (O_WRONLY | O_CREAT);
    op.buffered_fd = ::open(op.path.c_str(), flags | O_CLOEXEC, 0644);
    if (op.buffered_fd < 0) {
      op.fail(errno, "open");
      return;
    }
    if (op.is_read) {
      struct stat st;
      if (::fstat(op.buffered_fd, &st) == 0 && st.st_size < op.file_offset + op.nbytes) {
        op.fail(0, "file has " + std::to_string(st.st_size) + " bytes, cannot read " +
                       std::to_string(op.nbytes) + " bytes at offset " + std::to_string(op.file_offset));
        close_fds(op);
        return;
      }
    }
    const bool aligned = reinterpret_cast<uintptr_t>(op.buffer) % kDirectAlignment == 0 &&
                         op.file_offset % kDirectAlignment == 0 && op.nbytes >= kDirectAlignment;
    if (aligned) {
      // Filesystems without O_DIRECT (tmpfs) refuse it here; buffered I/O then does it all.
      op.direct_fd = ::open(op.path.c_str(), flags | O_CLOEXEC | O_DIRECT, 0644);
    }
  }

  void worker_loop() {
    while (true) {
      Task task{nullptr, 0};
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to do
        task = queue_.front();
        queue_.pop_front();
        ++running_;
      }
      assert(task.op != nullptr && task.op->tasks_left > 0);  // checked in DEBUG=1 builds
      run_task(*task.op, task.index);
      {
        std::lock_guard<std::mutex> guard(mutex_);
        --running_;
        if (--task.op->tasks_left == 0) {
          close_fds(*task.op);
          task.op->done = true;
        }
      }
      done_cv_.notify_all();
    }
  }

  void run_task(IoOp& op, int index) {
    const int64_t batch = single_submit_ ? block_size_ : block_size_ * queue_depth_;
    if (overlap_events_) {
      for (int64_t start = op.cursor.fetch_add(batch); start < op.nbytes && !op.failed;
           start = op.cursor.fetch_add(batch)) {
        transfer(op, start, std::min(batch, op.nbytes - start));
      }
      return;
    }
    const int64_t begin = index * op.slice_bytes;
    const int64_t end = std::min(op.nbytes, begin + op.slice_bytes);
    for (int64_t start = begin; start < end && !op.failed; start += batch) {
      transfer(op, start, std::min(batch, end - start));
    }
  }

  // Bytes [start, start + len) of the op's buffer: the aligned body with
  // O_DIRECT when possible, the rest through the page cache.
  void transfer(IoOp& op, int64_t start, int64_t len) {
    int64_t direct_len = 0;
    if (op.direct_fd >= 0 && start % kDirectAlignment == 0) {
      direct_len = len / kDirectAlignment * kDirectAlignment;
    }
    if (direct_len > 0) {
      const int rc = transfer_all(op.direct_fd, op.is_read, op.buffer + start, direct_len,
                                  op.file_offset + start);
      if (rc == EINVAL) {
        direct_len = 0;  // accepted at open, refused at I/O: redo it buffered
      } else if (rc != 0) {
        record(op, rc, start, direct_len);
        return;
      }
    }
    if (direct_len < len) {
      const int rc = transfer_all(op.buffered_fd, op.is_read, op.buffer + start + direct_len,
                                  len - direct_len, op.file_offset + start + direct_len);
      if (rc != 0) record(op, rc, start + direct_len, len - direct_len);
    }
  }

  void record(IoOp& op, int rc, int64_t start, int64_t len) {
    const std::string where = std::to_string(len) + " bytes at file offset " +
                              std::to_string(op.file_offset + start);
    if (rc == -1) {
      op.fail(0, "file ended before " + where + " could be read");
    } else {
      op.fail(rc, where);
    }
  }

  std::vector<IoError> collect(const std::vector<std::shared_ptr<IoOp>>& ops) {
    std::vector<IoError> errors;
    for (const auto& op : ops) {
      wait_for(*op);
      if (op->failed) errors.push_back(op->error);
    }
    return errors;
  }

  void wait_for(const IoOp& op) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&op] { return op.done; });
  }

  const int64_t block_size_;
  const int64_t queue_depth_;
  const bool single_submit_;
  const bool overlap_events_;
  const int64_t num_threads_;

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Task> queue_;
  int running_ = 0;
  bool stopping_ = false;
  std::map<int64_t, std::shared_ptr<IoOp>> pending_;  // by ticket, in submission order
  int64_t next_ticket_ = 1;
  std::unordered_set<void*> locked_;
  std::vector<std::thread> workers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rankscope async file I/O engine (thread pool, O_DIRECT when aligned)";
  using release_gil = py::call_guard<py::gil_scoped_release>;
  py::class_<AioHandle>(m, "AioHandle")
      .def(py::init<int64_t, int64_t, bool, bool, int64_t>(), py::arg("block_size"),
           py::arg("queue_depth"), py::arg("single_submit"), py::arg("overlap_events"),
           py::arg("intra_op_parallelism"))
      .def("submit", &AioHandle::submit, release_gil(), py::arg("tensor"), py::arg("path"),
           py::arg("is_read"), py::arg("file_offset"))
      .def("run", &AioHandle::run, release_gil(), py::arg("tensor"), py::arg("path"),
           py::arg("is_read"), py::arg("file_offset"))
      .def("wait_ops", &AioHandle::wait_ops, release_gil(), py::arg("tickets"))
      .def("is_done", &AioHandle::is_done, py::arg("ticket"))
      .def("wait", &AioHandle::wait, release_gil())
      .def("pending", &AioHandle::pending)
      .def("new_cpu_locked_tensor", &AioHandle::new_cpu_locked_tensor, py::arg("num_elem"),
           py::arg("example_tensor"))
      .def("free_cpu_locked_tensor", &AioHandle::free_cpu_locked_tensor, py::arg("tensor"))
      .def("get_block_size", &AioHandle::block_size)
      .def("get_queue_depth", &AioHandle::queue_depth)
      .def("get_single_submit", &AioHandle::single_submit)
      .def("get_overlap_events", &AioHandle::overlap_events)
      .def("get_intra_op_parallelism", &AioHandle::intra_op_parallelism);
}
