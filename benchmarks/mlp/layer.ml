(* Layers as records of closures over their own parameters and buffers: forward keeps
   what backward needs; backward takes dL/d(output), accumulates parameter gradients and
   returns dL/d(input); step applies and clears the gradients. *)

type t = {
  forward : float array -> float array;
  backward : float array -> float array;
  step : float -> unit;
}

(* softsign activation x / (1 + |x|): no transcendental functions *)
let softsign x = x /. (1. +. Float.abs x)
let softsign' x = let d = 1. +. Float.abs x in 1. /. (d *. d)

let map_activation f f' : t =
  let last = ref [||] in
  {
    forward = (fun x -> last := x; Array.map f x);
    backward = (fun g -> Array.mapi (fun i gi -> gi *. f' !last.(i)) g);
    step = (fun _ -> ());
  }

let dense g ~inputs ~outputs : t =
  let scale = 1. /. sqrt (float_of_int inputs) in
  let w = Array.init outputs (fun _ -> Array.init inputs (fun _ -> Rng.uniform g (-.scale) scale)) in
  let b = Array.make outputs 0. in
  let gw = Array.init outputs (fun _ -> Array.make inputs 0.) and gb = Array.make outputs 0. in
  let input = ref [||] in
  let forward x =
    input := x;
    Array.init outputs (fun o ->
        let row = w.(o) in
        let s = ref b.(o) in
        for i = 0 to inputs - 1 do s := !s +. (row.(i) *. x.(i)) done;
        !s)
  in
  let backward dy =
    let x = !input in
    let dx = Array.make inputs 0. in
    for o = 0 to outputs - 1 do
      let d = dy.(o) and row = w.(o) and grow = gw.(o) in
      gb.(o) <- gb.(o) +. d;
      for i = 0 to inputs - 1 do
        grow.(i) <- grow.(i) +. (d *. x.(i));
        dx.(i) <- dx.(i) +. (d *. row.(i))
      done
    done;
    dx
  in
  let step lr =
    for o = 0 to outputs - 1 do
      let row = w.(o) and grow = gw.(o) in
      for i = 0 to inputs - 1 do
        row.(i) <- row.(i) -. (lr *. grow.(i));
        grow.(i) <- 0.
      done;
      b.(o) <- b.(o) -. (lr *. gb.(o));
      gb.(o) <- 0.
    done
  in
  { forward; backward; step }

type network = t list

let forward (net : network) x = List.fold_left (fun x l -> l.forward x) x net
let backward (net : network) g = ignore (List.fold_left (fun g l -> l.backward g) g (List.rev net))
let step (net : network) lr = List.iter (fun l -> l.step lr) net
