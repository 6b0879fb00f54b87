(* The scheduler's kernel: packets, task control blocks whose behaviour is a closure,
   and the primitives a task calls (wait, hold, release, send). Each primitive returns
   the task control block the scheduler should consider next. *)

type kind = Device | Work

type packet = {
  mutable link : packet option;
  mutable dest : int;       (* the receiver while queued; the sender once delivered *)
  kind : kind;
  mutable count : int;
  data : int array;         (* four letters, 1..26 *)
}

type tcb = {
  id : int;
  pri : int;
  next : tcb option;        (* the task list, by decreasing priority *)
  mutable queue : packet option;
  mutable held : bool;
  mutable waiting : bool;
  mutable run : packet option -> tcb option;
}

type t = {
  tasks : tcb option array;
  mutable current : tcb option;
  mutable list : tcb option;
  mutable sent : int;
  mutable holds : int;
}

let create ntasks = { tasks = Array.make (ntasks + 1) None; current = None; list = None; sent = 0; holds = 0 }

let packet ?link ~dest kind = { link; dest; kind; count = 0; data = Array.make 4 0 }

let add_task k ~id ~pri ?queue ~waiting run =
  let t = { id; pri; next = k.list; queue; held = false; waiting; run } in
  k.tasks.(id) <- Some t;
  k.list <- Some t

let find k id = match k.tasks.(id) with Some t -> t | None -> invalid_arg "Kernel.find"
let cur k = match k.current with Some t -> t | None -> invalid_arg "Kernel.cur"

(* adds [p] at the end of a queue, returning the queue's new head *)
let append p queue =
  p.link <- None;
  match queue with
  | None -> Some p
  | Some q as head ->
    let rec last q = match q.link with None -> q.link <- Some p | Some r -> last r in
    last q;
    head

let wait k = let t = cur k in t.waiting <- true; Some t
let hold k = let t = cur k in k.holds <- k.holds + 1; t.held <- true; t.next

let release k id =
  let t = find k id and c = cur k in
  t.held <- false;
  if t.pri > c.pri then Some t else Some c

let send k p =
  let t = find k p.dest and c = cur k in
  k.sent <- k.sent + 1;
  p.link <- None;
  p.dest <- c.id;
  match t.queue with
  | None ->
    t.queue <- Some p;
    if t.pri > c.pri then Some t else Some c
  | Some _ as q ->
    t.queue <- append p q;
    Some c

let runnable t = (not t.held) && ((not t.waiting) || t.queue <> None)

let schedule k =
  let rec loop = function
    | None -> ()
    | Some t when not (runnable t) -> loop t.next
    | Some t ->
      k.current <- Some t;
      let msg =
        if t.waiting then
          match t.queue with
          | Some p ->
            t.queue <- p.link;
            t.waiting <- false;
            Some p
          | None -> None
        else None
      in
      loop (t.run msg)
  in
  loop k.list
