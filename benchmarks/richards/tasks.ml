(* Task behaviours as closures over their private state. Ids: 1 idle, 2 worker,
   3 and 4 handlers, 5 and 6 devices. *)

open Kernel

let idle_id = 1 and worker_id = 2 and handler_a = 3 and handler_b = 4 and device_a = 5 and device_b = 6

(* counts down, waking one device or the other by a shift-register sequence *)
let idle k ~count =
  let bits = ref 1 and left = ref count in
  fun (_ : packet option) ->
    decr left;
    if !left = 0 then hold k
    else if !bits land 1 = 0 then begin
      bits := !bits lsr 1;
      release k device_a
    end
    else begin
      bits := (!bits lsr 1) lxor 0xD008;
      release k device_b
    end

(* fills work packets with letters and sends them to the two handlers in turn *)
let worker k =
  let target = ref handler_a and letter = ref 0 in
  function
  | None -> wait k
  | Some p ->
    target := (if !target = handler_a then handler_b else handler_a);
    p.dest <- !target;
    p.count <- 0;
    for i = 0 to 3 do
      incr letter;
      if !letter > 26 then letter := 1;
      p.data.(i) <- !letter
    done;
    send k p

(* pairs the letters of work packets with device packets, one letter per device packet *)
let handler k =
  let work = ref None and devices = ref None in
  fun msg ->
    (match msg with
     | Some p -> if p.kind = Work then work := append p !work else devices := append p !devices
     | None -> ());
    match !work with
    | None -> wait k
    | Some w ->
      if w.count < 4 then
        match !devices with
        | None -> wait k
        | Some d ->
          devices := d.link;
          d.count <- w.data.(w.count);
          w.count <- w.count + 1;
          send k d
      else begin
        work := w.link;
        send k w
      end

(* holds one packet at a time and hands it back when woken; [out] sees each letter *)
let device k ~out =
  let held = ref None in
  function
  | None ->
    (match !held with
     | None -> wait k
     | Some p ->
       held := None;
       send k p)
  | Some p ->
    held := Some p;
    out p.count;
    hold k
