(* Richards: runs the six-task operating-system simulation [reps] times and reports
   the packet and hold counts and a checksum of the letters the devices saw.
   Arguments: idle count, repetitions. *)

let simulate ~count =
  let k = Kernel.create 6 in
  let letters = ref 0 in
  let out c = letters := ((!letters * 31) + c) land 0xffffff in
  let open Tasks in
  Kernel.add_task k ~id:idle_id ~pri:0 ~waiting:false (idle k ~count);
  let work = Kernel.packet ~link:(Kernel.packet ~dest:0 Kernel.Work) ~dest:0 Kernel.Work in
  Kernel.add_task k ~id:worker_id ~pri:1000 ~queue:work ~waiting:true (worker k);
  let devs d =
    Kernel.packet ~link:(Kernel.packet ~link:(Kernel.packet ~dest:d Kernel.Device) ~dest:d Kernel.Device) ~dest:d
      Kernel.Device
  in
  Kernel.add_task k ~id:handler_a ~pri:2000 ~queue:(devs device_a) ~waiting:true (handler k);
  Kernel.add_task k ~id:handler_b ~pri:3000 ~queue:(devs device_b) ~waiting:true (handler k);
  Kernel.add_task k ~id:device_a ~pri:4000 ~waiting:true (device k ~out);
  Kernel.add_task k ~id:device_b ~pri:5000 ~waiting:true (device k ~out);
  Kernel.schedule k;
  (k.Kernel.sent, k.Kernel.holds, !letters)

let () =
  let count = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10000 in
  let reps = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let total_sent = ref 0 and total_holds = ref 0 and last = ref (0, 0, 0) in
  for _ = 1 to reps do
    let (s, h, _) as r = simulate ~count in
    total_sent := !total_sent + s;
    total_holds := !total_holds + h;
    last := r
  done;
  let s, h, l = !last in
  Printf.printf "count %d: %d packets queued, %d holds, letters checksum %d\n" count s h l;
  Printf.printf "over %d runs: %d packets, %d holds\n" reps !total_sent !total_holds
